"""Hostile or inconsistent records on the path that moves a pod off a card the kubelet still holds.

After a kubelet restart the kubelet may offer a pod other cards than its recorded one (its
checkpoint still gives that card to a pod gone since, tests/test_deviceplugin_stale_checkpoint.py);
the plugin then moves a pod that holds nothing yet to an equal card no other pod holds or is
recorded on. Here the other pods' records are not to be trusted: unsigned or badly signed where
records are signed, a pod of another scheduler, a record of another node, two records on one card,
a record on another model's card or on a card this node does not have; and the pods carrying them
may be the ones the kubelet admits while a pod that could be moved waits. Whatever they say, the
plugin must never hand a card to two pods, never lose one, and refuse the offending pod only, with
a message saying why. Fake NVML, fake kubelet (its restart modelled by ``forget``) and fake API
server; the plugin's code real.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest

from dp_harness import NODE, Rig, bind_pod, container, record, rig
from fakekubelet import AdmissionError
from test_deviceplugin_stale_checkpoint import _four_a100s, _gone, _held_then, _record, _whole

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordKey, encode_allocation
from stowage.resources import RESOURCE_GPU

KEY = RecordKey(b"s" * 32)
STOWAGE = "stowage-scheduler"
# records signed, and honoured only on Stowage's scheduler's pods: a hardened deployment
HARDENED = dict(record_key=KEY, scheduler_names=(STOWAGE,))


def _rec(r: Rig, card: int, node: str = NODE) -> AllocationRecord:
    c = r.nvml.cards[card]
    return AllocationRecord(node, (CardShare(card, c.uuid, c.memory_mib, 1000),), True)


def _signed(r: Rig, name: str, rec: AllocationRecord, bound_at: str, key: RecordKey = KEY,
            scheduler: str = STOWAGE, node: str = NODE, for_uid: str | None = None) -> dict[str, Any]:
    """A one-GPU pod bound to ``node`` whose record is signed with ``key`` for ``for_uid`` (its own uid unless told)."""
    pod = bind_pod(r, name, [container("main", gpus=1)], None, bound_at, scheduler=scheduler, node=node)
    value = encode_allocation(rec, key, for_uid if for_uid is not None else pod["metadata"]["uid"])
    return r.kube.patch_pod("default", name, {"metadata": {"annotations": {ALLOCATION_ANNOTATION: value}}})


def _stale_card_0(r: Rig) -> dict[str, Any]:
    """Card 0 is still held by a pod deleted while the kubelet was down; the pod "new" (signed, whole,
    card 0) waits. Card 1 is card 0's only twin (cards 2 and 3 are an A10 and a T4)."""
    old = _signed(r, "old", _rec(r, 0), "2024-01-01T00:00:01Z")
    r.kubelet.admit(old)
    _gone(r, old)
    return _signed(r, "new", _rec(r, 0), "2024-01-01T00:00:02Z")


@dataclass(frozen=True)
class Hostile:
    """A pod whose record names ``card`` and must not be honoured, and why the plugin says so."""

    bind: Callable[[Rig, int, str], dict[str, Any]]   # (rig, card, bound_at) -> the pod
    refusal: str                                       # what the plugin's refusal of it says
    admitted_here: bool = True                         # this node's kubelet admits it


HOSTILE = {
    "unsigned": Hostile(lambda r, card, at: bind_pod(r, "hostile", [container("main", gpus=1)],
                                                     encode_allocation(_rec(r, card)), at, scheduler=STOWAGE),
                        "is not signed"),
    "other-key": Hostile(lambda r, card, at: _signed(r, "hostile", _rec(r, card), at, key=RecordKey(b"x" * 32)),
                         "signature that does not match this pod"),
    "copied-signature": Hostile(lambda r, card, at: _signed(r, "hostile", _rec(r, card), at, for_uid="another-pod"),
                                "signature that does not match this pod"),
    "other-scheduler": Hostile(lambda r, card, at: _signed(r, "hostile", _rec(r, card), at,
                                                           scheduler="default-scheduler"),
                               "scheduler 'default-scheduler', which is not Stowage's"),
    "record-of-another-node": Hostile(lambda r, card, at: _signed(r, "hostile", _rec(r, card, node="gpu-node-2"), at),
                                      "names node 'gpu-node-2' but the pod is bound to 'gpu-node-1'"),
    "bound-to-another-node": Hostile(lambda r, card, at: _signed(r, "hostile", _rec(r, card), at, node="gpu-node-2"),
                                     "", admitted_here=False),
}


def _holders(r: Rig) -> dict[str, dict[str, set[str]]]:
    """card uuid -> pod uid -> the resources the kubelet gave that pod devices of on that card."""
    out: dict[str, dict[str, set[str]]] = {}
    with r.kubelet.cond:
        for uid, conts in r.kubelet.allocated.items():
            for res in conts.values():
                for resource, ids in res.items():
                    for i in ids:
                        out.setdefault(i.split("::")[0], {}).setdefault(uid, set()).add(resource)
    return out


def _no_card_twice(r: Rig) -> None:
    """A card whose nvidia.com/gpu device a pod holds (whole) holds no other pod's device."""
    for uuid, pods in _holders(r).items():
        whole = [u for u, res in pods.items() if RESOURCE_GPU in res]
        assert not whole or len(pods) == 1, f"card {uuid} given whole to {whole} and to {sorted(pods)}"


def _got(r: Rig, pod: dict[str, Any]) -> list[str]:
    return r.kubelet.allocated[pod["metadata"]["uid"]]["main"][RESOURCE_GPU]


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_record_not_honoured_on_the_twin_card_does_not_block_the_move(monkeypatch, kind):
    """The hostile pod's record names card 1, the only card the waiting pod can move to. Not honoured,
    it claims nothing: the waiting pod moves there, and the hostile pod is refused, saying why."""
    hostile = HOSTILE[kind]
    with rig(monkeypatch, **HARDENED) as r:
        assert r.registered()
        new = _stale_card_0(r)
        pod = hostile.bind(r, 1, "2024-01-01T00:00:03Z")
        assert r.kubelet.admit(new)["main"][RESOURCE_GPU].envs["STOWAGE_POD"] == "default/new"
        assert _got(r, new) == [r.uuid(1)]
        if hostile.admitted_here:
            with pytest.raises(AdmissionError, match=hostile.refusal):
                r.kubelet.admit(pod)
            assert pod["metadata"]["uid"] not in r.kubelet.allocated
        _no_card_twice(r)
        r.plugin.reconciler.run_once()
        assert _record(r, "new") == [r.uuid(1)]


@pytest.mark.parametrize("kind", [k for k, h in HOSTILE.items() if h.admitted_here])
def test_a_pod_whose_record_is_not_honoured_is_not_given_the_card_a_waiting_pod_would_move_to(monkeypatch, kind):
    """The kubelet admits the hostile pod (whose record copies the waiting pod's card 0) first: the
    plugin cannot take it for the waiting pod it would move, so the hostile pod gets no card,
    and the waiting pod, admitted next, still moves to the twin card."""
    hostile = HOSTILE[kind]
    with rig(monkeypatch, **HARDENED) as r:
        assert r.registered()
        new = _stale_card_0(r)
        pod = hostile.bind(r, 0, "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError, match=hostile.refusal) as refused:
            r.kubelet.admit(pod)
        assert "default/new: waits for its card, but the kubelet does not list it yet" in str(refused.value)
        assert pod["metadata"]["uid"] not in r.kubelet.allocated
        r.kubelet.admit(new)
        assert _got(r, new) == [r.uuid(1)]
        _no_card_twice(r)


def test_a_pod_without_a_record_is_not_given_the_card_a_waiting_pod_would_move_to(monkeypatch):
    """As above for a pod with no record at all (bound to the node by another scheduler, or by
    spec.nodeName): a card no record names would be invisible to the extender."""
    with rig(monkeypatch, **HARDENED) as r:
        assert r.registered()
        new = _stale_card_0(r)
        bare = bind_pod(r, "bare", [container("main", gpus=1)], None, "2024-01-01T00:00:01Z",
                        scheduler="default-scheduler")
        with pytest.raises(AdmissionError, match="no stowage.io/allocation record") as refused:
            r.kubelet.admit(bare)
        assert "default/new: waits for its card, but the kubelet does not list it yet" in str(refused.value)
        r.kubelet.admit(new)
        assert _got(r, new) == [r.uuid(1)]
        _no_card_twice(r)


def test_two_records_on_the_held_card_one_pod_moves_the_other_is_refused(monkeypatch):
    """Records not signed here (honoured as written): "new" and "double" both name card 0, which the
    kubelet still gives to a pod gone since. The first admitted moves to the twin card 1; the
    second has no equal card left (card 1 is the first one's now) and is refused."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        double = bind_pod(r, "double", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:03Z")
        r.kubelet.admit(new)
        assert _got(r, new) == [r.uuid(1)]
        with pytest.raises(AdmissionError, match="no equal card"):
            r.kubelet.admit(double)
        _no_card_twice(r)
        r.plugin.reconciler.run_once()
        assert (_record(r, "new"), _record(r, "double")) == ([r.uuid(1)], [r.uuid(0)])


def test_two_records_on_the_twin_card_each_card_goes_to_one_pod(monkeypatch):
    """Records not signed here: "twin-a" and "twin-b" are both booked on card 1 (double booking),
    "new" on card 0, which the kubelet still gives to a pod gone since. Card 1 is claimed, so no
    pod is moved there: "new", admitted first (the only pod the kubelet lists), is refused; the
    first twin then gets card 1 and the second is refused. Each card ends up with one pod at most."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        twins = [bind_pod(r, name, [container("main", gpus=1)], _whole(r, 1), "2024-01-01T00:00:03Z")
                 for name in ("twin-a", "twin-b")]
        with pytest.raises(AdmissionError, match="no equal card"):   # card 0 still held, card 1 claimed twice
            r.kubelet.admit(new)
        assert r.kubelet.admit(twins[0])["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        with pytest.raises(AdmissionError, match="default/twin-b: its record names card .*, which pod default/twin-a "
                                                 "already holds devices on: not honoured"):
            r.kubelet.admit(twins[1])
        _no_card_twice(r)
        assert new["metadata"]["uid"] not in r.kubelet.allocated
        assert twins[1]["metadata"]["uid"] not in r.kubelet.allocated


@pytest.mark.parametrize("rewrite", ["another-card", "removed"])
def test_a_share_is_not_moved_onto_a_card_held_whole_by_a_pod_whose_record_no_longer_names_it(monkeypatch, rewrite):
    """Records not signed here. "holder" runs on card 1 whole, but its record was since rewritten
    to name card 3, or removed. The kubelet offers card 1's memory devices (the holder has only
    its nvidia.com/gpu device): the share waiting on the held card 0 must not move there. (A
    rewritten record is corrected back to card 1; a removed one leaves only the kubelet's list to
    say who holds card 1.)"""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone, containers=[container("main", mem=80)],
                   rec=record([(0, r.uuid(0))], whole=False, mem_mib=80 * 1024))
        holder = bind_pod(r, "holder", [container("main", gpus=1)], _whole(r, 1), "2024-01-01T00:00:02Z")
        r.kubelet.admit(holder)
        value = _whole(r, 3) if rewrite == "another-card" else None
        r.kube.patch_pod("default", "holder", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: value}},
                                                "status": {"startTime": "2024-01-01T00:00:03Z"}})
        share = bind_pod(r, "share", [container("main", mem=8)], record([(0, r.uuid(0))], whole=False, mem_mib=8192),
                         "2024-01-01T00:00:04Z")
        with pytest.raises(AdmissionError, match="no equal card"):
            r.kubelet.admit(share)
        _no_card_twice(r)


def test_a_pod_recorded_on_a_held_card_of_another_model_is_not_moved_to_a_free_bigger_card(monkeypatch):
    """The pod is recorded on the A10 (card 2), which the kubelet still gives to a pod gone since;
    both A100s are free. It may have asked for the A10's model or memory: refused, not moved."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone, card=2)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 2), "2024-01-01T00:00:02Z")
        with pytest.raises(AdmissionError, match="no equal card"):
            r.kubelet.admit(new)
        assert new["metadata"]["uid"] not in r.kubelet.allocated


def _unknown_card_record() -> str:
    return record([(3, "GPU-ffffffff-1111-2222-3333-000000000009")], whole=True, mem_mib=81920, core_milli=1000)


def test_a_record_naming_a_card_this_node_does_not_have_is_refused_saying_so(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        ghost = bind_pod(r, "ghost", [container("main", gpus=1)], _unknown_card_record(), "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError, match="FAILED_PRECONDITION: .*default/ghost: its record names card "
                           "'GPU-ffffffff-1111-2222-3333-000000000009', which is not among the cards this plugin advertises"):
            r.kubelet.admit(ghost)
        assert ghost["metadata"]["uid"] not in r.kubelet.allocated


def test_a_record_naming_a_card_this_node_does_not_have_does_not_stop_another_pod_moving(monkeypatch):
    """A pod recorded on a card this plugin does not have (another node's, or one NVML cannot read
    since the plugin restarted) waits for as many devices as the pod on the held card: it is not a
    pod the kubelet can be admitting onto this node's cards, so it neither breaks the call nor
    makes the two look unlike."""
    with rig(monkeypatch, cards=_four_a100s()) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        bind_pod(r, "ghost", [container("main", gpus=1)], _unknown_card_record(), "2024-01-01T00:00:01Z")
        r.kubelet.admit(new)
        assert _got(r, new) == [r.uuid(1)]
        _no_card_twice(r)


def test_a_share_recorded_on_a_card_this_node_does_not_have_is_refused_saying_so(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        ghost = bind_pod(r, "ghost", [container("main", mem=4)],
                         record([(0, "GPU-ffffffff-1111-2222-3333-000000000009")], whole=False, mem_mib=4096),
                         "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError, match="FAILED_PRECONDITION: .*default/ghost: its record names card "
                           "'GPU-ffffffff-1111-2222-3333-000000000009', which is not among the cards this plugin advertises"):
            r.kubelet.admit(ghost)
        assert ghost["metadata"]["uid"] not in r.kubelet.allocated
