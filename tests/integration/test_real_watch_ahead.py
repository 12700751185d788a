"""The feed's watch from a resourceVersion ahead of the real kube-apiserver v1.28.7's own (as after
etcd is restored from a backup): the server answers it 200 and then nothing until its timeout,
changes made meanwhile included, so the feeder must notice it by itself. Control plane only."""
from __future__ import annotations

import threading
import time

import pytest
from realk8s import LocalK8s
from schedbed import IMAGE, POOL_LABEL, Pool

from extender.kube import PODS, Gone, KubeFeeder
from packing.model import ClusterModel


def test_a_watch_ahead_of_kube_apiserver_is_noticed_at_its_end_and_a_current_one_is_not(k8s: LocalK8s,
                                                                                        pool: Pool) -> None:
    f = KubeFeeder(ClusterModel(), k8s.api_client(), watch_timeout_s=2)
    f.sync_once()
    st = f.streams[PODS]
    f._watch(st)                              # from the list's own resourceVersion: no relist asked
    st.rv = str(int(st.rv) + 100_000)

    def create_meanwhile() -> None:
        time.sleep(0.5)
        k8s.core.create_namespaced_pod(pool.namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "meanwhile", "labels": {POOL_LABEL: pool.name}},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE}]}})
    maker = threading.Thread(target=create_meanwhile)
    maker.start()
    events = st.events
    with pytest.raises(Gone, match="ahead of the API server's"):
        f._watch(st)
    maker.join()
    assert st.events == events                # the pod created meanwhile never came on that watch
