"""Where the idle GPUs are (benchmarks.binpack.anatomy), on a hand-made cluster whose answer is known."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack.anatomy import anatomy, main, pod_kind
from benchmarks.binpack.trace import Nodes, Pods


def cluster() -> tuple[Nodes, Pods]:
    # n0: three cards and room; n1: one card on a node whose CPU no pod of this trace fits in.
    nodes = Nodes(names=("n0", "n1"), cpu_milli=np.array([64000, 1000]), memory_mib=np.array([64000, 64000]),
                  gpus=np.array([3, 1]), model=("T4", "T4"))
    # An 810 slice, two 470 slices and one whole GPU, each asking for 2 cores.
    pods = Pods(name="hand", cpu_milli=np.array([2000, 2000, 2000, 2000]), memory_mib=np.array([1, 1, 1, 1]),
                num_gpu=np.array([1, 1, 1, 1]), gpu_milli=np.array([810, 470, 470, 1000]), gpu_spec=("", "", "", ""))
    return nodes, pods


def test_gaps_free_cards_and_what_the_cards_hold():
    nodes, pods = cluster()
    # 2,750 of 4,000 milli: exactly the four pods above arrive, in the seed's order.
    for seed in (42, 43, 44):
        got = anatomy(nodes, pods, "stowage", seed, arrived_pct=68.75)
        assert got.arrived_pct == 68.75
        # The 810 alone on a card (190 idle), the two 470s together (60 idle), the whole GPU on
        # the third card of n0; n1's card is free but its node has no CPU for a 2-core pod.
        assert {(r.gap, r.cards, tuple(r.holds.items())) for r in got.gaps} == {(190, 1, (("810", 1),)),
                                                                               (60, 1, (("470+470", 1),))}
        assert (got.free_cards_fed, got.free_cards_starved) == (0, 1)
        assert sorted(got.slices) == [470, 470, 810]   # the share pods' slices in place, not the whole GPU
        assert got.idle_milli == 190 + 60 + 1000
        assert not got.failed
        text = got.format()
        assert "810 (1)" in text and "470+470 (1)" in text and "1 without" in text


def test_failed_pods_are_counted_by_kind():
    nodes, pods = cluster()
    # A 4-GPU pod never fits on this cluster (nodes of 3 and 1 cards); replayed to the end (130 %).
    big = Pods(name="hand", cpu_milli=np.append(pods.cpu_milli, 2000), memory_mib=np.append(pods.memory_mib, 1),
               num_gpu=np.append(pods.num_gpu, 4), gpu_milli=np.append(pods.gpu_milli, 1000),
               gpu_spec=pods.gpu_spec + ("",))
    got = anatomy(nodes, big, "stowage", 42, arrived_pct=200.0)
    assert got.failed["4-gpu"] >= 1 and got.failed_milli["4-gpu"] == 4000 * got.failed["4-gpu"]


def test_kinds():
    rows = Pods(name="k", cpu_milli=np.full(4, 1000), memory_mib=np.ones(4, np.int64),
                num_gpu=np.array([0, 1, 1, 8]), gpu_milli=np.array([0, 500, 1000, 1000]), gpu_spec=("",) * 4)
    assert [pod_kind(rows.request(j)) for j in range(4)] == ["cpu-only", "share", "1-gpu", "8-gpu"]


def test_cli_names_an_unknown_policy_before_reading_the_trace(capsys, tmp_path):
    """Refused while parsing: with no trace where --data-dir points, the policy is what is named."""
    with pytest.raises(SystemExit) as exc:
        main(["--policy", "no-such-policy", "--data-dir", str(tmp_path / "absent")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown placement policy 'no-such-policy'" in err and "absent" not in err
