"""`stowage plan --drain` and `stowage inspect` on big clusters: the work per node tried must not
grow with the cluster (a copy of the whole model per drain candidate made `plan --drain` on
5,000 nodes and 49,000 pods run for more than 15 minutes), and a candidate that cannot be
emptied must leave no trace on the plan of the next."""
from __future__ import annotations

from collections import Counter

from planning_clusters import add_node, uniform_cluster

from packing.model import ClusterModel
from stowage.resources import GpuRequest
from stowage_ops.planning import drain_plan


def test_drain_copies_the_cluster_once_not_once_per_candidate(monkeypatch):
    """Each candidate used to be tried on ``ClusterModel.copy()`` of the whole cluster (a deep copy
    of every node's arrays and every pod's allocation): O(nodes x cluster). 30 nodes with one pod
    each are 30 candidates."""
    copies = []
    real = ClusterModel.copy

    def counting(self: ClusterModel) -> ClusterModel:
        copies.append(len(self.allocations))
        return real(self)

    monkeypatch.setattr(ClusterModel, "copy", counting)
    m = uniform_cluster({f"n{i:02d}": 1 for i in range(30)})
    plan = drain_plan(m, placer="most-allocated")
    assert len(plan.drained) > 1 and plan.kept   # candidates emptied, and some that could not be
    assert len(copies) == 1


def tangled() -> ClusterModel:
    """Three 4-card nodes, tried c, a, b: c's first pod fits elsewhere (a's free card) and its
    second does not; a's 2-GPU pod fits (c's two free cards) and its 1-GPU pod does not; b is full.
    Were a failed trial's moves kept, or its pods not put back, a later candidate would see cards
    free that are not (c's, once its pods had left for good) and be emptied."""
    m = ClusterModel()
    for n in "abc":
        add_node(m, n, 4, 40, "A100-PCIE-40GB")
    m.assign("a-big", "ns/a-big", "a", [0, 1], GpuRequest(gpus=2))
    m.assign("a-one", "ns/a-one", "a", [2], GpuRequest(gpus=1))
    for k in range(4):
        m.assign(f"b{k}", f"ns/b{k}", "b", [k], GpuRequest(gpus=1))
    for k in range(2):
        m.assign(f"c{k}", f"ns/c{k}", "c", [k], GpuRequest(gpus=1, cpu_milli=500, host_mem_mib=256))
    return m


def test_a_candidate_that_cannot_be_emptied_leaves_no_trace():
    m = tangled()
    before = {uid: (al.node, al.cards, al.mem_mib, al.core_milli, al.cpu_milli) for uid, al in m.allocations.items()}
    for placer in ("pack", "most-allocated", "spread"):
        plan = drain_plan(m, placer=placer)
        assert plan.drained == []
        assert plan.kept == {"c": "no room on the nodes that stay for ns/c1 (1 whole GPU)",
                             "a": "no room on the nodes that stay for ns/a-one (1 whole GPU)",
                             "b": "no room on the nodes that stay for ns/b3 (1 whole GPU)"}
    assert {uid: (al.node, al.cards, al.mem_mib, al.core_milli, al.cpu_milli)
            for uid, al in m.allocations.items()} == before



def test_long_plans_say_how_far_they_are_on_stderr(monkeypatch):
    """On 5,000 nodes `plan --drain` tries thousands of candidates and `--shape` places up to
    --limit pods, a minute or more each: stderr says how far it is, every PROGRESS_EVERY of them
    (10 here, for the built-in 36-node cluster), and stdout, and JSON, stay as they were."""
    from click.testing import CliRunner

    import stowage_ops.plan_cmd as plan_cmd
    from stowage.cli import main

    args = ["plan", "--simulated", "--fill", "40", "--drain", "--shape", "10Gi"]
    quiet = CliRunner().invoke(main, [*args, "-o", "json"])
    monkeypatch.setattr(plan_cmd, "PROGRESS_EVERY", 10)
    r = CliRunner().invoke(main, [*args, "-o", "json"])
    assert r.exit_code == 0, r.output
    assert r.stdout == quiet.stdout
    lines = r.stderr.splitlines()
    assert "shape 10Gi: 10 pods placed so far..." in lines and "shape 10Gi: 20 pods placed so far..." in lines
    drain = [line for line in lines if line.startswith("drain: ")]
    assert drain[:2] == ["drain: 10 of 36 GPU nodes tried...", "drain: 20 of 36 GPU nodes tried..."]
    assert quiet.stderr == ""


def test_a_simulated_clusters_placer_learns_its_pods_once_not_once_per_candidate(monkeypatch):
    """Found by experiment: `plan --simulated FILE --fill 10000 --drain` on 1,000 nodes took 149 s,
    143 s of it teaching each candidate's fresh placer every pod of the cluster again
    (O(nodes x pods): 7.3 million observations for 7,250 pods). The placer is taught the pods once
    and each candidate gets a copy, as on a live cluster (:meth:`Learned.taught`). 30 nodes with
    one pod each: every pod's shape is read a bounded number of times, not 30 times."""
    import stowage_ops.planning as planning

    reads = []
    real = planning.shape_of_allocation

    def counting(al):
        reads.append(al.uid)
        return real(al)

    monkeypatch.setattr(planning, "shape_of_allocation", counting)
    m = uniform_cluster({f"n{i:02d}": 1 for i in range(30)})
    plan = drain_plan(m, placer="pack")
    assert len(plan.drained) > 1
    assert max(Counter(reads).values()) <= 4, Counter(reads).most_common(3)


def test_a_big_fill_says_how_far_it_is_on_stderr(monkeypatch):
    """Found by experiment: `inspect --simulated FILE --fill 50000` ran 100 s (2 ms per pod placed
    through the extender's calls) without a word. Every FILL_PROGRESS_EVERY pods tried (10 here) a
    line on stderr; stdout, and JSON, stay as they were."""
    from click.testing import CliRunner

    import stowage_ops.cluster_source as cs
    from stowage.cli import main

    args = ["inspect", "--simulated", "--fill", "25", "--no-cards", "-o", "json"]
    quiet = CliRunner().invoke(main, args)
    monkeypatch.setattr(cs, "FILL_PROGRESS_EVERY", 10)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert r.stdout == quiet.stdout
    assert [line for line in r.stderr.splitlines() if line.startswith("fill: ")] == [
        "fill: 10 of 25 random pods tried...", "fill: 20 of 25 random pods tried..."]
    assert quiet.stderr == ""
