"""The kubelet PodResources API v1: proto, generated stubs (gitignored) and the client."""
