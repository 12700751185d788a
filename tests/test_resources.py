"""The pod request rule and quantity parsing that every component shares."""
import pytest

from stowage.resources import GpuRequest, RequestError, parse_quantity, pod_gpu_request
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
