"""Stranded whole cards: free GPUs on nodes that cannot take one more 1-GPU pod (no pod slot left,
or less host CPU or memory free than the running 1-GPU whole-card pods' median asks for).

What Stowage exists to avoid ("nobody pays for stranded GPUs"), and before this no series said it:
the extender counted free whole cards cluster-wide, and in the real-scheduler replays of issue 13
all of the 188-265 whole cards left free at the end were of this kind.
"""
from __future__ import annotations

import math

from packing.model import ClusterModel
from packing.stranded import typical_one_gpu_host_request, stranded_whole_cards
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

GiB = 1024


def gpu_node(m: ClusterModel, name: str, cards: int, cpu_milli: float = math.inf, mem_mib: float = math.inf,
             max_pods: float = math.inf) -> None:
    inv = Inventory(cards=tuple(Card(index=k, uuid=f"{name}-{k}", model="A100", memory_mib=80 * GiB)
                                for k in range(cards)), source="annotation")
    m.upsert_node(name, inv, cpu_milli=cpu_milli, host_mem_mib=mem_mib, max_pods=max_pods)


def one_gpu(cpu: int, mem: float) -> GpuRequest:
    return GpuRequest(gpus=1, cpu_milli=cpu, host_mem_mib=mem)


def test_free_cards_on_a_node_out_of_cpu_memory_or_pod_slots_are_stranded():
    m = ClusterModel()
    gpu_node(m, "cpu-gone", 4, cpu_milli=16_000, mem_mib=256 * GiB)
    gpu_node(m, "mem-gone", 4, cpu_milli=64_000, mem_mib=64 * GiB)
    gpu_node(m, "slots-gone", 4, cpu_milli=64_000, mem_mib=256 * GiB, max_pods=2)
    gpu_node(m, "roomy", 4, cpu_milli=64_000, mem_mib=256 * GiB)
    m.assign("a", "ns/a", "cpu-gone", [0], one_gpu(8_000, 16 * GiB))
    m.assign("b", "ns/b", "cpu-gone", [1], one_gpu(7_000, 16 * GiB))     # 1 CPU left: < 7 CPUs
    m.assign("c", "ns/c", "mem-gone", [0], one_gpu(8_000, 56 * GiB))    # 8 GiB left: < 16 GiB
    m.assign("d", "ns/d", "slots-gone", [0], one_gpu(8_000, 16 * GiB))
    m.assign("e", "ns/e", "slots-gone", [], GpuRequest(cpu_milli=100))   # a CPU-only pod takes the last slot
    m.assign("f", "ns/f", "roomy", [0], one_gpu(8_000, 16 * GiB))
    m.assign("g", "ns/g", "roomy", [1], one_gpu(0, 0))                  # a 1-GPU pod without requests
    typical = typical_one_gpu_host_request(m.allocations.values())
    # the 1-GPU pods' median, each taken alone: the one without requests does not hide the rest
    assert typical == (8_000, 16 * GiB)
    # cpu-gone 2 free, mem-gone 3, slots-gone 3; roomy's 2 free cards can each take such a pod
    assert stranded_whole_cards(m.a, *typical) == 2 + 3 + 3


def test_without_a_running_one_gpu_pod_only_pod_slots_and_overbooking_strand_cards():
    m = ClusterModel()
    gpu_node(m, "n1", 8, cpu_milli=8_000, mem_mib=64 * GiB, max_pods=1)
    gpu_node(m, "n2", 8, cpu_milli=8_000, mem_mib=64 * GiB)
    gpu_node(m, "unmodelled", 8)                                        # no host figures: never stranded
    m.assign("big", "ns/big", "n2", range(4), GpuRequest(gpus=4, cpu_milli=9_000, host_mem_mib=8 * GiB),
             check=False)                                               # bound by another scheduler: CPU overbooked
    m.assign("train", "ns/train", "n1", range(4), GpuRequest(gpus=4, cpu_milli=1_000, host_mem_mib=8 * GiB))
    typical = typical_one_gpu_host_request(m.allocations.values())
    assert typical == (0, 0)                                            # no 1-GPU pod runs: nothing to go by
    assert stranded_whole_cards(m.a, *typical) == 4 + 4                   # n1: no slot; n2: CPU below 0


def test_unhealthy_cards_and_unschedulable_nodes_are_not_counted():
    m = ClusterModel()
    gpu_node(m, "n1", 4, cpu_milli=1_000, mem_mib=64 * GiB)
    m.assign("a", "ns/a", "n1", [0], one_gpu(1_000, 1 * GiB))
    assert stranded_whole_cards(m.a, 1_000, 1 * GiB) == 3
    i = m.index["n1"]
    m.a.healthy[i, 1] = False
    assert stranded_whole_cards(m.a, 1_000, 1 * GiB) == 2
    m.a.node_ok[i] = False
    assert stranded_whole_cards(m.a, 1_000, 1 * GiB) == 0


def test_the_extenders_metrics_say_how_many_free_cards_are_stranded():
    """Served from the live model at each scrape, beside free_whole_cards."""
    from extender.app import create_app
    from extender.service import ExtenderService

    m = ClusterModel()
    gpu_node(m, "cpu-gone", 4, cpu_milli=16_000, mem_mib=256 * GiB)
    gpu_node(m, "roomy", 4, cpu_milli=64_000, mem_mib=256 * GiB)
    m.assign("a", "ns/a", "cpu-gone", [0], one_gpu(12_000, 16 * GiB))   # 4 CPUs left, a 1-GPU pod asks 8
    m.assign("b", "ns/b", "roomy", [0], one_gpu(8_000, 16 * GiB))
    text = create_app(ExtenderService(m)).test_client().get("/metrics").get_data(as_text=True)
    assert "stowage_extender_free_whole_cards 6.0" in text
    assert "stowage_extender_stranded_whole_cards 3.0" in text
    assert "# HELP stowage_extender_stranded_whole_cards" in text and "1-GPU pod" in text


def test_stowage_inspect_names_the_nodes_whose_free_cards_are_stranded():
    """The alert's "stowage inspect shows the nodes": per node the stranded whole cards and why,
    in the JSON and the table's STATE, and the total in the summary."""
    from stowage_ops.inspect_cmd import render_table, report

    m = ClusterModel()
    gpu_node(m, "cpu-gone", 4, cpu_milli=16_000, mem_mib=256 * GiB)
    gpu_node(m, "slots-gone", 4, cpu_milli=64_000, mem_mib=256 * GiB, max_pods=1)
    gpu_node(m, "roomy", 4, cpu_milli=64_000, mem_mib=256 * GiB)
    m.assign("a", "ns/a", "cpu-gone", [0], one_gpu(12_000, 16 * GiB))
    m.assign("b", "ns/b", "slots-gone", [0], one_gpu(8_000, 16 * GiB))
    m.assign("c", "ns/c", "roomy", [0], one_gpu(8_000, 16 * GiB))
    rep = report(m)
    by_name = {n["name"]: n for n in rep["nodes"]}
    assert {k: n["strandedWholeGpus"] for k, n in by_name.items()} == {"cpu-gone": 3, "slots-gone": 3, "roomy": 0}
    assert "4 CPU free" in by_name["cpu-gone"]["strandedBecause"] and "8 CPU" in by_name["cpu-gone"]["strandedBecause"]
    assert "no pod slot" in by_name["slots-gone"]["strandedBecause"] and by_name["roomy"]["strandedBecause"] == ""
    assert rep["summary"]["strandedWholeGpus"] == 6
    table = render_table(rep, cards=False)
    row = next(line for line in table.splitlines() if line.startswith("cpu-gone"))
    assert "3 free GPUs stranded" in row and "4 CPU free" in row
    assert "6 free GPUs on nodes that cannot take a 1-GPU pod" in table.splitlines()[0]
