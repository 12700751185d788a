"""What the two node agents share: the device plugin and the exporter both run on every GPU node.

- :mod:`gpunode.nvml`: the only code that talks to NVML (discovery, XID events, health probes).
- :mod:`gpunode.health`: the per-card health state machine (XIDs, probes, recovery), so a card is
  "healthy" in the exporter's metrics exactly when the device plugin advertises it Healthy.
- :mod:`gpunode.devices`: the device-ID scheme of the three resources (card key, ``<key>::<n>``);
  the plugin advertises these IDs and the exporter maps the kubelet's IDs back to cards with it.
- :mod:`gpunode.podresources`: the client of the kubelet's PodResources API.

It stands on the contract (``stowage``) and below both agents, which never import each other.
"""
