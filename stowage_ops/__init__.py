"""The operator commands, above the packing core and the extender: ``stowage inspect`` and
``stowage plan`` (what-if planning over a copy of the cluster model) and where they read the
cluster from (a simulated file, or the API server through the extender's feed)."""
