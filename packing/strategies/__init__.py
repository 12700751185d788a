"""The placement strategies, one per file. The simple ones are a pure scoring function with its
formula in the docstring (as kube-scheduler's ``noderesources`` strategies are); the
fragmentation-aware ones are placers with learned state. :mod:`packing.registry` names them."""
