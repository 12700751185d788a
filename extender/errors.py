"""Errors shared by the extender's HTTP layer and its Kubernetes I/O.

Kept in a module of its own so that :mod:`extender.kube_binder` (API I/O) and
:mod:`extender.service` (the verbs) can both use them without importing each other.
"""
from __future__ import annotations


class BindError(RuntimeError):
    """The binding could not be completed; the message goes back to kube-scheduler as ``Error``.

    Raised only after the pod was left with no half-recorded allocation (or, when the API
    server's state could not be determined, with the message saying so).
    """


class BindOutcomeUnknown(BindError):
    """The Binding may or may not have been applied: its answer was lost and the pod could not be
    read back, or (``kube_binder.BindMayLand``) it was answered 5xx or lost and the pod reads back
    unbound, so the API server may still apply it. The pod may be running on the cards, so the
    service keeps their reservation instead of handing them to another pod: a retry of the pod to
    the same node completes on it, a deletion releases it, and a bind to another node releases it
    once the pod is seen unbound (for ``BindMayLand``: once the Binding can no longer land)."""


class KubeConfigError(RuntimeError):
    """No usable Kubernetes client configuration (kubeconfig / in-cluster service account)."""
