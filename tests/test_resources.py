"""The pod request rule and quantity parsing that every component shares."""
import re

import pytest

from stowage.resources import GpuRequest, RequestError, parse_quantity, pod_gpu_request, pod_host_request
from stowage.inventory import model_matches, normalize_model


def pod(containers, init=(), **spec):
    return {"spec": {"containers": list(containers), "initContainers": list(init), **spec}}


@pytest.mark.parametrize("q,expected", [("2", 2), ("500m", 0.5), ("20Gi", 20 * 2**30), ("1e3", 1000), (4, 4), ("1k", 1000)])
def test_parse_quantity(q, expected):
    assert float(parse_quantity(q)) == expected


@pytest.mark.parametrize("bad", ["", "abc", "1.5.5", None, True, "Gi"])
def test_parse_quantity_rejects_garbage(bad):
    with pytest.raises(RequestError):
        parse_quantity(bad)


def test_whole_gpus_sum_over_containers():
    p = pod([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
             {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}}])
    assert pod_gpu_request(p) == GpuRequest(gpus=3)


def test_init_containers_use_effective_request_rule():
    big_init = {"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
    app = {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    assert pod_gpu_request(pod([app], [big_init])).gpus == 4
    sidecar = {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    # The sidecar keeps running beside the app container: 1 + 1.
    assert pod_gpu_request(pod([app], [sidecar])).gpus == 2


def test_shared_request_units():
    p = pod([{"name": "a", "resources": {"limits": {"nvidia.com/gpu-memory": "20", "nvidia.com/gpu-core": "30"}}}])
    r = pod_gpu_request(p)
    assert (r.gpus, r.mem_mib, r.core_milli) == (0, 20 * 1024, 300) and r.is_shared
    assert pod_gpu_request(p, memory_unit_mib=512).mem_mib == 20 * 512


def test_gpu_with_memory_means_big_enough_whole_cards():
    p = pod([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpu-memory": "20"}}}])
    assert pod_gpu_request(p) == GpuRequest(gpus=1, min_card_mem_mib=20 * 1024)


@pytest.mark.parametrize("limits,msg", [
    ({"nvidia.com/gpu": "-1"}, "negative"),
    ({"nvidia.com/gpu": "1.5"}, "whole number"),
    ({"nvidia.com/gpu-memory": "4", "nvidia.com/gpu-core": "150"}, "percentage"),
    ({"nvidia.com/gpu-core": "50"}, "needs nvidia.com/gpu-memory"),
])
def test_bad_requests_are_clear_errors(limits, msg):
    with pytest.raises(RequestError, match=msg):
        pod_gpu_request(pod([{"name": "a", "resources": {"limits": limits}}]))


def test_no_gpu_pod():
    assert not pod_gpu_request(pod([{"name": "a", "resources": {"limits": {"cpu": "1"}}}])).is_gpu


def test_exact_model_matching():
    assert normalize_model("NVIDIA A100-SXM4-80GB") == normalize_model("NVIDIA-A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert normalize_model("Tesla T4") == "T4"
    assert model_matches("A100", "NVIDIA A100-SXM4-80GB")
    assert not model_matches("A10", "NVIDIA A100-SXM4-80GB")
    assert model_matches("a10", "NVIDIA A10")
    assert not model_matches("A100", "NVIDIA A10")
    assert not model_matches("A10", "NVIDIA A10G")


def _containers(n: int, first: str = "c") -> list[dict]:
    return [{"name": f"{first}{i}", "resources": {"requests": {"cpu": "1"}}} for i in range(n)]


def test_more_containers_than_stowage_schedules_are_refused_by_their_count_alone():
    """Kubernetes has no limit on a pod's containers (a real API server took 25,774), and the
    extender's watch kept each container's name and requests of every pending pod for ever: a pod
    of ~18,000 kept ~11.5 MiB. Stowage schedules pods of at most MAX_CONTAINERS_PER_POD, init
    containers included, checked before any is read, and the error is the same whatever the
    count past it and whatever the containers past it hold (the copy keeps one past the limit:
    extender.kube_objects.pod_for_bind)."""
    from stowage.resources import MAX_CONTAINERS_PER_POD as N, pod_host_request
    bad = {"name": "late", "resources": {"limits": {"nvidia.com/gpu": "-1", "cpu": "lots"}}}
    errors = set()
    for app, init in ((N + 1, 0), (0, N + 1), (N, 1), (N + 5, 3), (5_000, 5_000), (25_774, 0)):
        for p in (pod(_containers(app), _containers(init, "i")),
                  pod(_containers(app) + [bad], _containers(init, "i")),
                  pod(_containers(app), _containers(init, "i") + [bad])):
            for read in (pod_gpu_request, pod_host_request):
                with pytest.raises(RequestError) as exc:
                    read(p)
                errors.add(str(exc.value))
    assert errors == {f"more than {N} containers (init containers included): Stowage schedules pods of at most {N}"}


def test_a_pod_within_the_container_limit_is_read_as_before():
    from stowage.resources import MAX_CONTAINERS_PER_POD as N, pod_host_request
    assert pod_host_request(pod(_containers(N))) == (N * 1000, 0.0)
    assert pod_host_request(pod(_containers(N - 2), _containers(2, "i"))) == ((N - 2) * 1000, 0.0)
    # entries that are not objects (only the port sends them) are not containers: not counted
    assert pod_host_request(pod(_containers(N) + ["x"] * 10)) == (N * 1000, 0.0)
    assert pod_gpu_request(pod(_containers(N - 1) + [{"name": "g", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
                               )) == GpuRequest(gpus=2)


def test_what_a_placed_pod_holds_is_read_whatever_its_containers():
    """The limit is on what Stowage schedules: a pod already placed (its record, its CPU and
    memory on its node, read with ``max_containers=None``) holds what it asks for whatever its
    size, as kube-scheduler counts it."""
    from stowage.resources import pod_host_request
    big = pod(_containers(5_000) + [{"name": "g", "resources": {"limits": {"nvidia.com/gpu": "2"}}}])
    assert pod_host_request(big, max_containers=None) == (5_000 * 1000, 0.0)
    assert pod_gpu_request(big, max_containers=None) == GpuRequest(gpus=2)


@pytest.mark.parametrize("resources,what", [
    ("lots", "resources of container 'c' is not an object"),
    ({"limits": ["nvidia.com/gpu"]}, "resources.limits of container 'c' is not an object"),
    ({"requests": 5}, "resources.requests of container 'c' is not an object"),
])
def test_container_resources_that_are_not_objects_are_refused_with_a_clear_error(resources, what):
    """No API server stores such a pod, but anything reaching the extender's port may send one:
    the request rule says what is wrong (it raised ValueError/AttributeError/TypeError with
    Python's words: 'dictionary update sequence element #0 has length 14; 2 is required')."""
    pod = {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    with pytest.raises(RequestError, match=re.escape(what)):
        pod_gpu_request(pod)
    with pytest.raises(RequestError, match=re.escape(what)):
        pod_host_request(pod)
