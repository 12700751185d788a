"""What the Kubernetes feed keeps of pending pods, and of a list's pods until its end, is bounded
per pod and in all, whatever pod authors write.

Found by measurement: the copy kept of each pending pod of Stowage's schedulers (until it is
bound, for ever if it is refused before it reaches the extender) held every container's name and
requests: a pod of ~18,000 minimal containers (within etcd's 1.5 MiB; a real API server took
25,774) kept ~11.5 MiB, and 100 such pods put the extender past its 1 GiB at every restart's
first list. And however small each copy, their number was not bounded: tens of thousands of
crafted pending pods (~21 KiB each) kept hundreds of MiB.
"""
from __future__ import annotations

import sys

import orjson
import pytest
from extender_harness import bytes_kept
from extender_kube_helpers import feeders, inv_node, kube, make_pod, new_feeder  # noqa: F401

from extender.kube_binder import KubeBinder
from extender.kube_objects import pod_for_bind, pod_for_learn
from extender.pending_pods import _ENTRY_BYTES, PendingPods, pack, unpack
from extender.service import ExtenderService
from extender.wire import BindingArgs
from packing.pod_policy import POLICY_KEYS
from stowage.resources import MAX_CONTAINERS_PER_POD

SCHED = "stowage-scheduler"
EACH = 37_000   # characters: 7 values x 37,000 stay within an API server's 256 KiB of annotations


def pending(i: int, *, containers: int = 0, crafted: bool = False, name: str | None = None) -> dict:
    """A pending pod of Stowage's scheduler: ``containers`` more minimal containers, or Stowage
    annotations written to be big (each kept up to its limit: a ~21 KiB copy)."""
    ann = {k: k[-1] * EACH for k in sorted(POLICY_KEYS)} | {"stowage.io/zzz": "z" * EACH} if crafted else {}
    p = make_pod(name or f"p-{i:05d}", gpus=1, annotations=ann, uid=f"{i:08d}-5b7a-4f7e-9d39-1c2b3a4d5e6f")
    p["metadata"]["resourceVersion"] = str(1000 + i)
    p["spec"]["schedulerName"] = SCHED
    p["spec"]["containers"] += [{"name": f"c{k}", "image": "i", "resources": {}} for k in range(containers)]
    return p


def key(p: dict) -> str:
    return f"{p['metadata']['namespace']}/{p['metadata']['name']}"


def fed(f, pods: list[dict]) -> int:
    """Bytes that stay after the feed applies ``pods``, each decoded from its JSON as a watch
    event's object is (so what the feed keeps of it is its own, as in the extender)."""
    raws = [orjson.dumps(p) for p in pods]
    return bytes_kept(lambda raw: f._apply_pod(orjson.loads(raw)), raws)


def test_pending_pods_of_many_containers_keep_little(kube):
    """Each kept every container: 10 pods of 5,000 containers kept ~29 MiB (~2.9 MiB each)."""
    f = new_feeder(kube)
    pods = [pending(i, containers=5_000) for i in range(10)]
    kept = fed(f, pods)
    assert len(f._pending) == 10
    assert kept < 10 * 64 * 1024, f"{kept / 2**20:.1f} MiB kept"
    for p in pods:
        copy = f._pending.get(key(p))
        assert copy == pod_for_bind(p) and len(copy["spec"]["containers"]) == MAX_CONTAINERS_PER_POD + 1


def test_ordinary_pending_pods_are_kept_packed(kube):
    """A copy kept parsed held ~2.3 KiB for an ordinary pod (~5 MiB for 2,000); packed, ~0.5 KiB."""
    f = new_feeder(kube)
    pods = [pending(i) for i in range(2_000)]
    kept = fed(f, pods)
    assert kept < 2_000 * 1024, f"{kept / 2_000:.0f} bytes a pod"
    assert 0.9 < f._pending.bytes_used / kept < 1.2, (f._pending.bytes_used, kept)   # what they hold
    assert [f._pending.get(key(p)) for p in pods] == [pod_for_bind(p) for p in pods]
    assert [f.pending_uid(key(p)) for p in pods] == [p["metadata"]["uid"] for p in pods]


def test_crafted_pending_pods_keep_the_feed_within_its_bytes(kube):
    """Each copy is bounded (~21 KiB crafted), their number was not: 300 kept 6.5 MiB, and 20,000
    ~430 MiB. Now the copies stay within the bytes, the count follows what is really held, and
    the newest stay."""
    budget = 2 << 20
    f = new_feeder(kube, pending_bytes=budget)
    pods = [pending(i, crafted=True) for i in range(300)]
    kept = fed(f, pods)
    assert kept < budget * 1.1, f"{kept / 2**20:.1f} MiB kept"
    assert f._pending.bytes_used <= budget
    assert 0.9 < f._pending.bytes_used / kept < 1.2, (f._pending.bytes_used, kept)
    assert 80 < len(f._pending) < 110                                               # ~20 KiB each
    assert list(f._pending) == [key(p) for p in pods[-len(f._pending):]]           # the oldest went
    assert f._pending.evicted == 300 - len(f._pending)


def test_pending_pods_are_bounded_in_entries_too(kube):
    f = new_feeder(kube, pending_entries=50)
    for i in range(120):
        f._apply_pod(pending(i))
    assert list(f._pending) == [key(pending(i)) for i in range(70, 120)]
    assert f.pending_uid(key(pending(69))) is None and f.pending_uid(key(pending(70))) == pending(70)["metadata"]["uid"]


def test_the_count_of_bytes_is_exact_bookkeeping():
    """What each pod adds is what it takes away: replacing a copy, dropping, keeping only some,
    whatever the order, leaves the count the sum of what is kept; a packed copy reads back equal."""
    store = PendingPods(max_entries=5, max_bytes=10**9)
    pods = {f"ns/p{i}": pod_for_bind(pending(i, containers=i)) for i in range(8)}

    def put(k: str, p: dict) -> None:
        store.put(k, p["metadata"]["uid"], pack(p))
    for k, p in pods.items():
        put(k, p)
    assert list(store) == [f"ns/p{i}" for i in range(3, 8)] and store.evicted == 3
    put("ns/p5", pods["ns/p2"])   # replaced: now the newest
    store.pop("ns/p6")
    store.pop("ns/absent")
    store.keep_only({"ns/p3", "ns/p5", "ns/p7", "ns/other"})
    assert list(store) == ["ns/p3", "ns/p7", "ns/p5"]
    assert [store.get(k) for k in store] == [pods["ns/p3"], pods["ns/p7"], pods["ns/p2"]]
    assert store.uid("ns/p5") == pods["ns/p2"]["metadata"]["uid"] and store.uid("ns/p6") is None
    assert store.bytes_used == sum(_ENTRY_BYTES + sys.getsizeof(k) + sys.getsizeof(store.uid(k))
                                   + sys.getsizeof(store.packed(k)) for k in store)
    for k in list(store):
        store.pop(k)
    assert store.bytes_used == 0 and len(store) == 0
    one = PendingPods(max_entries=5, max_bytes=1)   # the newest stays even alone over the bytes
    one.put("ns/a", "u1", pack(pods["ns/p1"]))
    one.put("ns/b", "u2", pack(pods["ns/p2"]))
    assert list(one) == ["ns/b"] and one.evicted == 1


def test_a_packed_copy_reads_back_as_it_was():
    """Bind reads the copy back: same keys in the same order (the first unknown annotation is
    the one refused), same types (a bool is not an int, 1.0 is not 1), for every odd pod."""
    from test_extender_kube_feeder import _odd_pods
    for p in _odd_pods():
        for copy in (pod_for_bind(p), pod_for_learn(p)):
            back = unpack(pack(copy))
            assert back == copy and repr(back) == repr(copy)
    assert pack({"x": object()}) is None   # (only a hand-made object holds what JSON has no form for)


def test_a_pod_past_the_bounds_is_read_at_bind_and_comes_back_with_its_next_event(kube, feeders):
    """A copy dropped for the bounds costs a GET at bind (for a pod not seen at filter) and the
    requeue (``pending_uid`` is None); the pod's next watch event keeps it again, as newest; a
    bound or deleted pod leaves; bind never uses an old copy of a re-created pod."""
    kube.create_node(inv_node("n1", [80, 80]))
    f = new_feeder(kube, pending_entries=2)
    feeders.append(f)
    a, _, c = (kube.create_pod(pending(i)) for i in range(3))
    f.start()
    kube.wait_for(lambda: f.ready()[0] and len(f._pending) == 2)
    assert f.pending_uid(key(a)) is None and f.pending_uid(key(c)) == c["metadata"]["uid"]
    svc = ExtenderService(f.model, binder=KubeBinder(kube.api_client()), pod_source=f)

    def gets() -> int:
        return len([r for r in kube.requests if r[0] == "GET" and r[1] == "/api/v1/namespaces/default/pods/p-00000"])

    before = gets()
    assert f.get_pod("default", "p-00000")["metadata"]["uid"] == a["metadata"]["uid"]   # read from the API server
    assert gets() == before + 1
    kube.update("pods", "default", "p-00000", lambda p: p["metadata"].setdefault("labels", {}).update(x="1"))
    kube.wait_for(lambda: f.pending_uid(key(a)) == a["metadata"]["uid"])   # back, as newest
    assert list(f._pending) == [key(c), key(a)]
    assert gets() == before + 1 and f.get_pod("default", "p-00000") == pod_for_bind(kube.get_pod("default", "p-00000"))
    # Re-created under the same name: the new pod's copy, and a bind for the old uid is refused.
    kube.delete_pod("default", "p-00000")
    kube.wait_for(lambda: key(a) not in f._pending)
    a2 = kube.create_pod(pending(7, name="p-00000"))
    kube.wait_for(lambda: f.pending_uid(key(a)) == a2["metadata"]["uid"])
    assert "re-created" in svc.bind(BindingArgs("p-00000", "default", a["metadata"]["uid"], "n1"))
    assert svc.bind(BindingArgs("p-00000", "default", a2["metadata"]["uid"], "n1")) == ""
    kube.wait_for(lambda: key(a) not in f._pending)                      # bound: gone
    kube.delete_pod("default", "p-00002")
    kube.wait_for(lambda: len(f._pending) == 0)
    assert f._pending.bytes_used == 0


@pytest.mark.parametrize("page_size", [1000, 7])   # 1000: the whole list in one page
def test_a_list_shows_its_pods_before_its_learn_copies_pass_their_bytes(kube, page_size):
    """A list kept a learn copy of every pod of Stowage's schedulers until its last page (~0.2 MiB
    for one written to be big, ~1,000 of them ~200 MiB at every list). Past ``list_learn_bytes``
    the copies kept are shown at once, in creation order among themselves: every pod is still
    shown once, and no more than the budget (and one copy) is held at a time."""
    pods = []
    for i in range(60):
        p = pending(i, containers=MAX_CONTAINERS_PER_POD - 1 if i % 3 == 0 else 0)
        p["metadata"]["creationTimestamp"] = f"2024-05-01T10:{(i * 7) % 60:02d}:00Z"
        pods.append(kube.create_pod(p, emit=False))
    biggest = max(sys.getsizeof(pack(pod_for_learn(p))) for p in pods) + 1024   # (and its sort key)
    budget = 4 * biggest
    f = new_feeder(kube, page_size=page_size, list_learn_bytes=budget)
    batches: list[list[dict]] = [[]]
    held: list[int] = []
    f.learning_in_bulk = lambda: _Batch(batches)
    f.on_pod_seen = lambda pod: batches[-1].append(pod)
    apply = f._apply_pod

    def watched(pod, deleted=False, listing=None):
        apply(pod, deleted, listing)
        if listing is not None:
            held.append(listing.learn_bytes)
    f._apply_pod = watched
    f.sync_once()
    shown = [p["metadata"]["uid"] for batch in batches for p in batch]
    assert sorted(shown) == sorted(p["metadata"]["uid"] for p in pods) and len(shown) == len(set(shown))
    assert len([b for b in batches if b]) > 3
    from extender.kube import creation_order
    for batch in batches:
        assert batch == sorted(batch, key=creation_order)
    assert max(held) <= budget + biggest


class _Batch:
    """learning_in_bulk for the test: each use starts a new batch of shown pods."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __enter__(self) -> None:
        if self.batches[-1]:
            self.batches.append([])

    def __exit__(self, *exc) -> None:
        return None
