"""Which pod is the kubelet allocating for, and which devices does it get: pure logic.

The kubelet's GetPreferredAllocation and Allocate carry only device IDs and a size, never the
pod. The pod is identified from the pods bound to this node that carry a Stowage allocation
record (``stowage.io/allocation``, written by the extender at bind time) and have containers
still waiting for this resource. Which containers are served is learned from the kubelet's
PodResources API (:class:`~deviceplugin.corrections.KubeletView`, which survives a plugin restart)
and from the :class:`Ledger` of Allocate calls this process answered (one per container, init
containers first as the kubelet does; the only source when PodResources is unreachable, and the
only one for init containers, which a v1.28 kubelet does not list). While PodResources answers, a
regular container counts as served only once it lists it: an answer the kubelet never took up
(another caller's, or one cut off by a kubelet restart) must not refuse the pod's real admission
(:func:`_progress`); an init container whose answer a restarting kubelet lost is asked for again,
and served again from the record (:meth:`Candidate.at`). A pod that holds some but not
all of its devices is the one the kubelet is admitting (admission is serial): while there is
one, only it is a candidate, so all of a container's resources land on the same card. Records
that the kubelet has already contradicted are matched in their corrected form
(:mod:`deviceplugin.corrections`). A pod with ``status.startTime`` has been admitted (the kubelet
sets it only after admission, devices included) and is never a candidate: during a restarted
kubelet's re-admission PodResources lists only the pods re-added so far, so "not listed" alone
does not mean "waiting for devices". A pod that finished (phase Succeeded/Failed) holds nothing,
even while PodResources still lists it with devices (a restarted kubelet does until it has admitted
the pods of its first list).

- GetPreferredAllocation (a hint): candidates whose next container asks for exactly
  ``allocation_size`` devices and whose recorded card(s) have enough of the offered devices.
  One candidate, or only interchangeable ones (same cards, same size): propose devices on its
  card(s). Several that disagree: propose for the one bound earliest, the order in which the
  kubelet admits pods, and let Allocate cross-check.
- Allocate (authoritative): the device IDs' cards and count must match a candidate's record.
  Two pods of the same size on different cards are told apart by the card; a request that
  matches no record, or several records that disagree, is refused with a gRPC error naming the
  devices and the candidates. A container never gets a card other than its pod's record, except:
- A recorded card the kubelet does not offer (its checkpoint still gives it to a pod deleted or
  finished since: a restarted kubelet admits the pods of its first list before it drops those,
  ../shared/kubelet/README.md): the pod, if nothing was given to it yet, is moved to an equal card
  (same model and memory) that the kubelet offers and that no other pod of the node holds or is
  recorded on (:func:`relocation`), preferring one NVLinked / on the NUMA node of its other cards.
  Refusing would fail its admission although a card is free; the reconciler then corrects the
  record to the card it got, and the extender follows. A whole pod is moved only for
  ``nvidia.com/gpu`` (its memory/compute devices follow the moved record). Only when no waiting
  pod's record matches the offered devices, and only when every pod that could be the one
  admitted would be moved alike (the kubelet does not say which one it admits: a pod must not
  land on another model's card).
- When PodResources answers, only a pod it lists is a candidate: the kubelet lists a pod from when
  it takes it up, before its admission, so a waiting pod it does not list is not the one being
  admitted. The pod that is then has no record the plugin honours (none, unsigned, another
  scheduler's, ...): taken for the waiting pod, it would get that pod's card (or, moved, a card no
  record names), and the waiting pod would be refused in its turn. It is refused instead. Without
  PodResources (a documented fallback) the plugin cannot tell, and such a pod may still take a
  waiting pod's card.
- A record naming a card this plugin does not advertise (another node's, or one NVML has not read
  yet) makes its pod no candidate: the kubelet cannot be admitting it onto this node's cards.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from stowage.allocation import AllocationError, AllocationRecord, RecordTrust
from stowage.resources import (GPU_RESOURCES, RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY, RequestError,
                               container_requests, pod_containers, quantity_to_int, shown)

from gpunode.devices import DeviceTable, UnknownDevice
from .corrections import KubeletView, bind_order as _order, share_on

FAILED_PRECONDITION = "FAILED_PRECONDITION"
INVALID_ARGUMENT = "INVALID_ARGUMENT"

_TERMINAL = {"Succeeded", "Failed"}


class AllocationRefused(Exception):
    """The plugin refuses a kubelet request; ``code`` is the gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Candidate:
    """A pod bound to this node with an allocation record and containers still to allocate."""

    uid: str
    namespace: str
    name: str
    record: AllocationRecord
    sizes: tuple[int, ...]      # devices of this resource per container (init first), only > 0
    done: int                   # Allocate calls already answered for this pod and resource
    order: tuple[str, ...]      # bind time, creation time, namespace, name: kubelet admission order
    in_progress: bool = False   # the kubelet gave it some of its devices but not all: being admitted
    started: bool = False       # some device of any of our resources was given to it (ledger or kubelet list)
    moved_from: AllocationRecord | None = None   # its record before :func:`relocation` moved it
    again: int = 0              # its first ``again`` containers (init ones) may be asked for again (:func:`_progress`)
    retried: bool = False       # :meth:`at` placed it on an earlier container than ``done``: the kubelet asks again
    others_started: bool = False   # some device of another of our resources counts as given to it

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def next_size(self) -> int:
        return self.sizes[self.done]

    @property
    def cards(self) -> frozenset[str]:
        return frozenset(self.record.uuids)

    @property
    def signature(self) -> tuple[frozenset[str], int, bool]:
        return self.cards, self.next_size, self.record.whole

    def at(self, size: int, holds_none: bool = False) -> Candidate | None:
        """This pod placed on the container the kubelet asks ``size`` devices for; None if none of its
        containers it may ask for next needs that many.

        Its next container first; else the latest of the init containers whose answers may have been
        lost (``again``): the kubelet asks for them again in order, and the latest keeps ``done`` at or
        past the kubelet's own position, so each of its next requests is one the pod can take.

        ``holds_none``: a GetPreferredAllocation without ``must_include``, so the kubelet holds no
        device of this resource the container could reuse. The kubelet's next container of a pod whose
        init containers it holds devices for reuses them (no call at all, or ``must_include`` naming
        them: its devicesToAllocate), so when the ledger's init answers may have been lost, such a
        request is the pod's first container asked again, whatever the next container's size. Why:
        an init container asked again with the size of the main container was taken for the main
        container: refused in the fallback when the main container then asked, reusing its devices,
        and never moved off a recorded card that went Unhealthy meanwhile."""
        if holds_none and min(self.again, self.done) > 0:
            return self.asked_again(0, size)
        if self.next_size == size:
            return self
        for k in reversed(range(min(self.again, self.done))):
            if (again := self.asked_again(k, size)) is not None:
                return again
        return None

    def asked_again(self, k: int, size: int) -> Candidate | None:
        """This pod placed on its container ``k``, whose answer may have been lost, asked again for
        ``size`` devices; None if that is not one of those containers or not its size. Asked again
        from its first container, the pod holds nothing of this resource (the kubelet dropped nothing
        it took up), so it may be moved like a pod not started (:func:`relocation`)."""
        if k >= min(self.again, self.done) or self.sizes[k] != size:
            return None
        return replace(self, done=k, again=0, retried=True, started=self.started if k else self.others_started)

    def describe(self) -> str:
        again = sorted({self.sizes[k] for k in range(min(self.again, self.done))} - {self.next_size})
        also = f", or {' or '.join(map(str, again))} for an init container asked again" if again else ""
        return (f"{self.ref} (next container needs {self.next_size}{also}, "
                f"recorded card(s) {', '.join(self.record.uuids)})")


@dataclass
class Ledger:
    """Allocate calls answered so far, per (pod uid, resource): the device IDs of each container.

    ``serves``: per resource, how many times this process has served its socket; each kubelet
    restart deletes it, so a new serve is a new kubelet. ``served_at``: per (pod uid, resource), that
    count when its last answer was given. Only a kubelet restarted since (a lost answer) asks for a
    container again: a running kubelet rejects a pod whose Allocate failed, and never retries it.
    """

    given: dict[tuple[str, str], list[tuple[str, ...]]] = field(default_factory=dict)
    serves: dict[str, int] = field(default_factory=dict)
    served_at: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, uid: str, resource: str) -> int:
        return len(self.given.get((uid, resource), ()))

    def add(self, uid: str, resource: str, ids: Iterable[str], at: int | None = None) -> None:
        """Book the answer of the pod's container at position ``at`` (its next one, or an init
        container asked again; None: the one after those booked). The answers booked from there on were lost (the kubelet never took
        them up: it asks for that container now) and are dropped. Why: while PodResources answers,
        a regular container counts as served only once the kubelet lists it, so each lost answer of
        one (another caller's, a restarting kubelet's) was appended, for as long as its pod lived
        (40 lost answers, 40 entries); now a pod holds at most one entry per container."""
        entries = self.given.setdefault((uid, resource), [])
        if at is not None:
            del entries[at:]
        entries.append(tuple(ids))
        self.served_at[(uid, resource)] = self.serves.get(resource, 0)

    def new_kubelet(self, resource: str) -> None:
        """The socket of ``resource`` is served anew (at start, or after a kubelet restart deleted it)."""
        self.serves[resource] = self.serves.get(resource, 0) + 1

    def kubelet_restarted_since(self, uid: str, resource: str) -> bool:
        """Whether the kubelet may have restarted since pod ``uid``'s last answer of ``resource``."""
        return self.served_at.get((uid, resource), 0) < self.serves.get(resource, 0)

    def cards(self, table: DeviceTable, uid: str, resources: Iterable[str]) -> set[str]:
        """The cards of the devices this process gave pod ``uid`` in ``resources``."""
        return {table.card_of(r, i).uuid for r in resources for ids in self.given.get((uid, r), ()) for i in ids}

    def reattribute(self, owner_uid: Any) -> None:
        """Move answers the kubelet lists under another pod to that pod.

        ``owner_uid(resource, device_id)`` is the uid of the pod PodResources lists with that
        device, or None. Allocate cannot see the pod, so an answer may have been booked to the
        wrong one of two pending pods; the kubelet's list says whose it really is.
        """
        for (uid, resource), entries in list(self.given.items()):
            for ids in list(entries):
                owners = {owner_uid(resource, i) for i in ids} - {None}
                if len(owners) == 1 and uid not in owners:
                    entries.remove(ids)
                    owner = owners.pop()
                    self.given.setdefault((owner, resource), []).append(ids)
                    self.served_at[(owner, resource)] = max(self.served_at.get((owner, resource), 0),
                                                            self.served_at.get((uid, resource), 0))
            if not entries:
                del self.given[(uid, resource)]
                self.served_at.pop((uid, resource), None)

    def copy(self) -> Ledger:
        """A copy to go back to when a call is refused after some of its container requests were booked."""
        return Ledger({k: list(v) for k, v in self.given.items()}, dict(self.serves), dict(self.served_at))

    def uids(self) -> set[str]:
        """Pods this process has answered at least one Allocate for."""
        return {uid for uid, _ in self.given}

    def forget_except(self, live_uids: set[str]) -> None:
        """Drop pods that no longer exist, so the ledger does not grow forever."""
        for key in [k for k in self.given if k[0] not in live_uids]:
            del self.given[key]
            self.served_at.pop(key, None)


def _container_sizes(pod: Mapping[str, Any], resource: str) -> tuple[int, ...]:
    return tuple(n for _, n in _named_sizes(pod, resource))


def _named_sizes(pod: Mapping[str, Any], resource: str) -> list[tuple[str, int]]:
    """(container name, devices of ``resource``) for containers that need some, init first."""
    return [(name, n) for name, n, _ in _sized_containers(pod, resource)]


def _sized_containers(pod: Mapping[str, Any], resource: str) -> list[tuple[str, int, bool]]:
    """(container name, devices of ``resource``, is an init container) for containers that need
    some, init first (the kubelet's admission order).

    Read by the request rule's own readers (:func:`~stowage.resources.pod_containers`,
    :func:`~stowage.resources.container_requests`), so containers or resources that are not what
    an API server stores raise :class:`RequestError` in its words: :func:`survey` makes that the
    pod's note, and the node's other pods are served. A quantity that does not parse counts as
    none of the resource (the API server refuses such a pod)."""
    _, app, init = pod_containers(pod, None)
    sizes = []
    for c, is_init in [(c, True) for c in init] + [(c, False) for c in app]:
        q = container_requests(c).get(resource, 0)
        try:
            n = quantity_to_int(q, f"{resource} of container {c.get('name', '?')}")
        except RequestError:
            n = 0
        if n > 0:
            sizes.append((str(c.get("name") or ""), n, is_init))
    return sizes


def _view_done(view: KubeletView | None, ref: tuple[str, str], named: list[tuple[str, int]], resource: str) -> int:
    """Containers served as the kubelet lists them: up to the last listed one (init containers are not listed)."""
    if view is None:
        return 0
    listed = view.containers(ref, resource)
    return max((k + 1 for k, (name, _) in enumerate(named) if name in listed), default=0)


@dataclass
class PodSurvey:
    candidates: list[Candidate]
    notes: list[str]            # pods that need the resource but cannot be candidates, and why
    # card uuid -> the pods (uid, or namespace/name for one the API does not list) that hold devices
    # on it or whose record names it: a card claimed by no other pod may take a moved pod
    claimed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # PodResources answered: a moved pod's record can be corrected to the card it got (without the
    # kubelet's list the reconciler cannot see it, the record would stay wrong: no move then)
    can_move: bool = False
    # cards advertised Unhealthy: the kubelet offers none of their devices, a refusal says so
    unhealthy: frozenset[str] = frozenset()

    def free_for(self, uid: str, uuid: str) -> bool:
        return self.claimed.get(uuid, frozenset()) <= {uid}


@dataclass(frozen=True)
class Progress:
    """How far the kubelet got with one pod's containers of one resource (see :func:`_progress`)."""

    served: int   # containers served (init first)
    listed: int   # served as the kubelet lists them
    again: int    # the first ``again`` containers (init ones) may be asked for again: their answers may be lost


def _progress(pod: Mapping[str, Any], uid: str, ref: tuple[str, str], ledger: Ledger,
              view: KubeletView | None) -> dict[str, Progress]:
    """resource -> :class:`Progress`, for each of our resources the pod uses.

    With the kubelet's list, a regular container is served only once the kubelet lists its devices
    (it records them before its next call): an Allocate this process answered but the kubelet never
    took up (another caller's, or one cut off while a restarting kubelet deleted the socket) must
    not count, or the pod's real admission is refused as "no pod waiting". The ledger still counts
    the init containers, which a v1.28 kubelet does not list (and reuses for the next container
    without a GetPreferredAllocation), up to their number: an extra answer (a lost one, or the
    kubelet asking again) cannot push the count into the regular containers. Without the list
    (PodResources unreachable) the ledger is all there is, as before.

    An init container's answer may have been lost the same way, and nothing says so: a kubelet
    restarted since then asks for it again (it re-admits the pod from the first container its
    checkpoint holds no devices for). So while no regular container counts as served, each init
    container answered so far may be asked for again (``again``) once the kubelet has restarted
    since the pod's last answer (:meth:`Ledger.kubelet_restarted_since`; a running kubelet rejects a
    pod whose call failed and asks nothing again); once a regular container counts as served
    (listed, or in the fallback answered), the kubelet is past them and an init-sized request is no
    retry.
    """
    out = {}
    for r in (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORE):
        sized = _sized_containers(pod, r)
        if sized:
            named = [(name, n) for name, n, _ in sized]
            inits = sum(1 for _, _, is_init in sized if is_init)
            listed = _view_done(view, ref, named, r)
            answered = ledger.count(uid, r)
            if view is not None:
                answered = min(answered, inits)
            served = max(answered, listed)
            retry = listed == 0 and served <= inits and ledger.kubelet_restarted_since(uid, r)
            out[r] = Progress(served, listed, served if retry else 0)
    return out


def _pod_ids(meta: Mapping[str, Any]) -> tuple[str, tuple[str, str]]:
    """A pod's uid as the ledger and the candidates key it (``namespace/name`` when it has none),
    and its (namespace, name) as the kubelet's list names it."""
    uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
    return uid, (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def given_any(pod: Mapping[str, Any], ledger: Ledger, view: KubeletView | None) -> bool:
    """Whether any device of our resources counts as given to ``pod``, as :func:`survey` counts it.

    The server keeps a pod's moved record (:func:`relocation`) only while this holds: a move whose
    answer the kubelet never took up must not outlive it, or the pod's next admission is steered to
    the card it was moved to, which the extender may have given another pod since, instead of its
    own recorded card, offered again by then."""
    uid, ref = _pod_ids(pod.get("metadata") or {})
    try:
        progress = _progress(pod, uid, ref, ledger, view)
    except RequestError:
        return False
    return any(p.served > 0 for p in progress.values())


def survey(pods: Iterable[Mapping[str, Any]], node: str, resource: str, ledger: Ledger,
           view: KubeletView | None = None, overrides: Mapping[str, AllocationRecord] | None = None,
           trust: RecordTrust | None = None, table: DeviceTable | None = None) -> PodSurvey:
    """The candidates among the pods bound to ``node``, plus notes explaining the others.

    ``view``: what the kubelet lists as allocated (None when PodResources is unreachable);
    ``overrides``: pod uid -> corrected record, used instead of the pod's annotation.
    """
    cands: list[Candidate] = []
    notes: list[str] = []
    pods = list(pods)
    live = {str(m.get("uid") or ""): (str(m.get("namespace") or ""), str(m.get("name") or ""))
            for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL
            for m in [p.get("metadata") or {}] if not m.get("deletionTimestamp")}
    finished = {(str(m.get("namespace") or ""), str(m.get("name") or ""))
                for p in pods if (p.get("status") or {}).get("phase") in _TERMINAL
                for m in [p.get("metadata") or {}]} - set(live.values())
    for pod in pods:
        meta = pod.get("metadata") or {}
        ref = f"{meta.get('namespace')}/{meta.get('name')}"
        status = pod.get("status") or {}
        if status.get("phase") in _TERMINAL or meta.get("deletionTimestamp"):
            continue
        if status.get("startTime"):
            # Admitted by the kubelet already (it sets startTime once admission, devices included,
            # is done): not waiting for devices, even when PodResources does not list it, as while a
            # restarted kubelet re-adds pods one at a time. Taking it for the pod being admitted
            # would hand that pod this one's card.
            continue
        try:
            sizes = _container_sizes(pod, resource)
        except RequestError as exc:
            # only this pod's problem: the survey reads every pod of the node at every call
            notes.append(f"{ref}: its containers' requests cannot be read: {exc}")
            continue
        if not sizes:
            continue
        uid, pod_ref = _pod_ids(meta)
        progress = _progress(pod, uid, pod_ref, ledger, view)
        done, again = progress[resource].served, progress[resource].again
        if done >= len(sizes):
            continue
        # only the kubelet's own list says "being admitted": a ledger entry of a pod whose
        # admission failed must not block the others
        in_progress = any(p.listed > 0 for p in progress.values())
        try:
            rec = (overrides or {}).get(uid) or (trust or RecordTrust()).record_of(pod)
        except AllocationError as exc:
            notes.append(f"{ref}: {exc}")
            continue
        if rec is None:
            notes.append(f"{ref}: no stowage.io/allocation record (not scheduled by the Stowage extender?)")
            continue
        if rec.node != node or not rec.cards:
            notes.append(f"{ref}: its record names node {rec.node!r} with {len(rec.cards)} card(s), this is {node!r}")
            continue
        unknown = [u for u in rec.uuids if u not in table.by_uuid] if table is not None else []
        if unknown:
            # Another node's card, or one NVML has not read since this plugin started: the kubelet
            # cannot be admitting the pod onto it. As a candidate it would only make the pod being
            # admitted look unlike it (no move), or break the call on the unknown card.
            notes.append(f"{ref}: its record names card {_unknown_cards(unknown)}, which is not among the cards "
                         "this plugin advertises")
            continue
        clash = _held_by_others(view, ledger, live, finished, table, uid, pod_ref, rec)
        if clash:
            notes.append(f"{ref}: {clash}")
            continue
        if view is not None and not view.lists(pod_ref):
            # The kubelet lists a pod (PodResources) from when it takes it up, before it admits it:
            # one it does not list is not the pod being admitted. Taken for it, it would hand its
            # card to that pod, which has no record the plugin honours (none, unsigned, another
            # scheduler's, ...), and refuse this one when its turn came. Its record still claims
            # its card (no other pod is moved onto it).
            notes.append(f"{ref}: waits for its card, but the kubelet does not list it yet, so it is not the pod being "
                         "admitted (that pod has no allocation record the plugin honours)")
            continue
        started = any(p.served > 0 for p in progress.values())
        others = any(p.served > 0 for r, p in progress.items() if r != resource)
        cands.append(Candidate(uid=uid, namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                               record=rec, sizes=sizes, done=done, order=_order(pod), in_progress=in_progress,
                               started=started, again=again, others_started=others))
    cands.sort(key=lambda c: c.order)
    busy = [c for c in cands if c.in_progress]
    if busy:
        notes += [f"{c.ref}: waits, the kubelet is admitting {', '.join(b.ref for b in busy)}" for c in cands if not c.in_progress]
        cands = busy
    claimed = _claims(pods, node, ledger, view, overrides or {}, trust or RecordTrust(), table, live, finished)
    return PodSurvey(cands, notes, claimed, can_move=view is not None)


def _claims(pods: list[Mapping[str, Any]], node: str, ledger: Ledger, view: KubeletView | None,
            overrides: Mapping[str, AllocationRecord], trust: RecordTrust, table: DeviceTable | None,
            live: Mapping[str, tuple[str, str]], finished: set[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """Card uuid -> who holds devices on it or is recorded on it, for :attr:`PodSurvey.claimed`.

    Recorded: every pod of the node not finished (a terminating pod still runs on its cards; a
    pending one will be admitted onto them). Holding: the kubelet's list, except pods that finished;
    a pod it lists that the API does not (deleted, still being torn down) counts, by name. Without
    the list, the devices this process gave the live pods.
    """
    if table is None:
        return {}
    out: dict[str, set[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in _TERMINAL:
            continue
        uid, _ = _pod_ids(meta)   # as survey names candidates
        try:
            rec = overrides.get(uid) or trust.record_of(pod)
        except AllocationError:
            continue
        if rec is not None and rec.node == node:
            for u in rec.uuids:
                out.setdefault(u, set()).add(uid)
    if view is not None:
        uid_of = {ref: uid for uid, ref in live.items()}
        for r in GPU_RESOURCES:
            for i, ref in view.owners(r).items():
                if ref not in finished:
                    out.setdefault(table.card_of(r, i).uuid, set()).add(uid_of.get(ref, f"{ref[0]}/{ref[1]}"))
    else:
        for uid in live:
            for u in ledger.cards(table, uid, GPU_RESOURCES):
                out.setdefault(u, set()).add(uid)
    return {u: frozenset(who) for u, who in out.items()}


def _held_by_others(view: KubeletView | None, ledger: Ledger, live: Mapping[str, tuple[str, str]],
                    finished: set[tuple[str, str]], table: DeviceTable | None, uid: str, ref: tuple[str, str],
                    rec: AllocationRecord) -> str:
    """Why ``rec``'s cards are not this pod's to have ('' if they are).

    A whole card is its pod's alone: its record cannot name a card on which another pod holds
    devices, and a share cannot land on a card another pod holds whole (the kubelet counts the
    three resources apart, so only the plugin can see this). Who holds what is the kubelet's own
    list; without it (PodResources unreachable) the devices this process gave the live pods
    (``live``: uid -> ref, pods not finished or deleted), so a forged record is refused in the
    fallback too, except for cards handed out before a plugin restart. A pod that finished holds
    nothing (``finished``: namespace/name), though a restarted kubelet lists it with its devices
    until it has admitted the pods of its first list.
    """
    if table is None:
        return ""
    mine = set(rec.uuids)
    kinds = GPU_RESOURCES if rec.whole else (RESOURCE_GPU,)   # whole: any device of theirs; share: their whole cards
    if view is not None:
        taken: Iterable[tuple[tuple[str, str], str]] = (
            (other, table.card_of(r, i).uuid) for r in kinds for i, other in view.owners(r).items()
            if other != ref and other not in finished)
    else:
        taken = ((o_ref, u) for o, o_ref in live.items() if o != uid for u in ledger.cards(table, o, kinds))
    for other, uuid in taken:
        if uuid in mine:
            return (f"its record names card {uuid}, which pod {other[0]}/{other[1]} already holds "
                    f"{'devices on' if rec.whole else 'whole'}: not honoured")
    return ""


UNKNOWN_SHOWN = 4          # unknown cards of one record a note names
UNKNOWN_CHARS = 64         # characters of each (a GPU or MIG UUID has 40)


def _unknown_cards(uuids: Sequence[str]) -> str:
    """A record's cards this plugin does not have, for a note: each quoted short (its text is the
    pod author's, up to 256 characters, in a cluster that does not sign records), the first few.
    Why: the note goes into the plugin's log line and the gRPC status the kubelet shows as the pod's
    admission error; written as it was, a uuid of escape sequences and new lines reached both."""
    return some_ids(uuids, UNKNOWN_SHOWN, "cards", UNKNOWN_CHARS)


def _explain(survey_: PodSurvey) -> str:
    parts = [c.describe() for c in survey_.candidates] + survey_.notes
    sick = [f"{c.ref}'s recorded card {u} is Unhealthy" for c in survey_.candidates for u in c.record.uuids
            if u in survey_.unhealthy]
    if sick:   # the reason the kubelet offers none of its devices, in the pod's admission error
        parts.append(", ".join(sick) + " (the kubelet offers no device of an Unhealthy card)")
    return "; ".join(parts) if parts else "no pod bound to this node is waiting for this resource"


ID_CHARS = 64              # characters of each device ID a message shows (the kubelet's IDs have at most 63)


def some_ids(ids: Sequence[str], count: int = 8, what: str = "devices", chars: int = ID_CHARS) -> str:
    """Device IDs (or other ``what``) for a message: all of them when few, else the first ``count``
    and how many; each quoted as ``repr`` writes it, at most ``chars`` characters of it.

    A request may carry 4 MiB of IDs (gRPC's limit): a refusal naming each one made a status message
    of a megabyte, which the caller's gRPC cannot receive (it sees RESOURCE_EXHAUSTED instead of the
    refusal), and a log line as long, per call. Quoted, because the IDs are the caller's text: an
    empty ID vanished from the message (``unknown device ID(s) ; ...``), one with a comma read as
    two, and one a megabyte long still made a megabyte message."""
    quoted = [shown(i, chars) for i in ids[:count]]
    if len(ids) <= count:
        return ", ".join(quoted)
    return f"{', '.join(quoted)}, ... ({len(ids)} {what})"


def _cards_of(table: DeviceTable, resource: str, ids: Iterable[str]) -> dict[str, str]:
    """device ID -> card UUID; unknown IDs are refused as INVALID_ARGUMENT."""
    out, unknown = {}, []
    for i in ids:
        try:
            out[i] = table.card_of(resource, i).uuid
        except UnknownDevice:
            unknown.append(i)
    if unknown:
        raise AllocationRefused(INVALID_ARGUMENT, f"{resource}: unknown device ID(s) {some_ids(sorted(unknown))}; "
                                "this plugin never advertised them")
    return out


def preferred(table: DeviceTable, resource: str, available: list[str], must_include: list[str], size: int,
              found: PodSurvey) -> tuple[Candidate, list[str]]:
    """The candidate being admitted and the devices to steer the kubelet to."""
    if size <= 0:
        raise AllocationRefused(INVALID_ARGUMENT, f"{resource}: allocation size must be positive, got {size}")
    # the kubelet offers each device once; an ID sent twice must not be proposed twice
    available, must_include = list(dict.fromkeys(available)), list(dict.fromkeys(must_include))
    card_of = _cards_of(table, resource, available + must_include)
    # The kubelet's must_include are devices the container already has (an init container's): among
    # those it offers, and no more than the size. A request breaking that matches no pod whatever
    # the node holds; "no pod waiting matches" would send its reader looking for a pod at fault.
    if len(must_include) > size:
        raise AllocationRefused(INVALID_ARGUMENT, f"{resource}: must_include names {len(must_include)} devices, "
                                f"more than the allocation size {size}")
    offered_ids = set(available)
    not_offered = [i for i in must_include if i not in offered_ids]
    if not_offered:
        raise AllocationRefused(INVALID_ARGUMENT, f"{resource}: must_include device(s) {some_ids(not_offered)} "
                                "are not among the available ones")
    fits = []
    for c in (m for c in found.candidates if (m := c.at(size, holds_none=not must_include)) is not None):
        if any(card_of[i] not in c.cards for i in must_include):
            continue
        pick, included = list(must_include), set(must_include)
        rest = sorted((i for i in available if card_of[i] in c.cards and i not in included),
                      key=lambda i: (c.record.uuids.index(card_of[i]), table.unit_number(i), i))
        pick += rest[: size - len(pick)]
        if len(pick) == size:
            fits.append((c, pick))
    if fits:
        # sorted by bind order: the pod the kubelet admits first; but a pod at its own next container
        # before one asked again for an init container: the kubelet asks again only after a restart,
        # while a pod whose admission failed after its init container (its Failed status not seen
        # yet) is no retry, and taken for one it would hand the pod admitted next its card
        return min(fits, key=lambda f: f[0].retried)
    offered = _by_card(card_of, available)
    movable = [m for c in found.candidates
               if (m := c.at(size, holds_none=not must_include)) is not None and _move_kind(table, resource, m, offered)]
    kinds = {_move_kind(table, resource, c, offered) for c in movable}
    if movable and len(kinds) == 1 and not must_include:
        # Any of them may be the pod being admitted (the kubelet lists each: survey); moved alike,
        # the card is as right for each (the reconciler then corrects the record of the one the
        # kubelet lists on it).
        moved = relocation(table, resource, movable[0], offered, found)
        if moved is not None:
            return moved
    raise AllocationRefused(FAILED_PRECONDITION, f"{resource}: no pod waiting on this node matches a request for "
                            f"{size} device(s) among the {len(available)} offered; candidates: {_explain(found)}"
                            f"{_not_moved(movable, len(kinds), found.can_move)}")


def _by_card(card_of: Mapping[str, str], ids: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in ids:
        out.setdefault(card_of[i], []).append(i)
    return out


def _equal(a: Any, b: Any) -> bool:
    """Cards a pod may be moved between: same model and memory, so every constraint the extender
    placed it by (model lists, minimum card memory, the share's size) holds on either."""
    return a.name == b.name and a.memory_mib == b.memory_mib


def _blocked(c: Candidate, offered: Mapping[str, list[str]]) -> list[str]:
    """The recorded cards the kubelet offers too few devices on for ``c``'s next container."""
    need = 1 if c.record.whole else c.next_size
    return [u for u in c.record.uuids if len(offered.get(u, ())) < need]


def _move_kind(table: DeviceTable, resource: str, c: Candidate,
               offered: Mapping[str, list[str]]) -> tuple[Any, ...] | None:
    """What a move of ``c`` would look like (None: it is not to be moved): whole or share, the cards
    it keeps, the model and memory of those it leaves. Pods of one kind are moved alike."""
    if c.started or c.in_progress or (c.record.whole and resource != RESOURCE_GPU):
        return None
    blocked = _blocked(c, offered)
    if not blocked:
        return None
    kept = tuple(u for u in c.record.uuids if u not in blocked)
    return c.record.whole, kept, tuple(sorted((table.by_uuid[u].name, table.by_uuid[u].memory_mib) for u in blocked))


def relocation(table: DeviceTable, resource: str, c: Candidate, offered: Mapping[str, list[str]],
               found: PodSurvey) -> tuple[Candidate, list[str]] | None:
    """``c`` moved off the recorded cards the kubelet offers too few devices on, and the devices it
    takes then; None when it cannot be moved.

    ``offered``: card uuid -> the device IDs of ``resource`` the kubelet offers there (in Allocate:
    the IDs it allocated). Only a pod the kubelet lists (it has taken the pod up: see the module's
    docstring) and nothing was given to yet moves (its containers must stay on
    one set of cards), a share to one card with all its devices, a whole pod only for
    ``nvidia.com/gpu`` (one device per card). Each blocked card is replaced by an equal card
    (:func:`_equal`) that the kubelet offers and no other pod holds or is recorded on, one
    NVLinked to or on the NUMA node of the pod's other cards first, then by index.
    """
    rec = c.record
    if not found.can_move or _move_kind(table, resource, c, offered) is None:
        return None
    need = 1 if rec.whole else c.next_size
    blocked = _blocked(c, offered)
    spare = [u for u, ids in offered.items()
             if u not in rec.uuids and len(ids) >= need and found.free_for(c.uid, u)]
    moved: dict[str, str] = {}
    for b in blocked:
        taken = [u for u in rec.uuids if u not in blocked] + list(moved.values())
        options = [u for u in spare if u not in moved.values() and _equal(table.by_uuid[u], table.by_uuid[b])]
        if not options:
            return None
        moved[b] = min(options, key=lambda u: (not _near(table, u, taken), table.by_uuid[u].index))
    new = replace(rec, cards=tuple(share_on(table, s, moved[s.uuid], rec.whole) if s.uuid in moved else s
                                   for s in rec.cards))
    pick: list[str] = []
    for u in new.uuids:
        pick += sorted(offered.get(u, ()), key=lambda i: (table.unit_number(i), i))[: c.next_size - len(pick)]
    if len(pick) != c.next_size:
        return None
    return replace(c, record=new, moved_from=rec), pick


def _near(table: DeviceTable, uuid: str, others: list[str]) -> bool:
    card = table.by_uuid[uuid]
    return any(table.by_uuid[o].index in card.nvlink or (card.numa >= 0 and table.by_uuid[o].numa == card.numa)
               for o in others)


def _not_moved(movable: list[Candidate], kinds: int, can_move: bool) -> str:
    """Why pods whose recorded cards the kubelet does not offer were not moved (for the refusal)."""
    if not movable:
        return ""
    why = ("the kubelet's PodResources API is unavailable, so its record could not be corrected" if not can_move else
           "they are not alike (the plugin cannot tell which one the kubelet is admitting)" if kinds > 1 else
           "no equal card (same model and memory) that the kubelet offers is free of other pods' devices and records")
    return (f"; the kubelet offers no device (or too few) on the recorded card(s) of {', '.join(c.ref for c in movable)}: "
            "it offers no device of a card it counts as Unhealthy, nor one its checkpoint gives to another pod, "
            "possibly one gone or finished while it was down, until it has admitted the pods it found on its start; "
            f"not moved elsewhere: {why}")


def allocate(table: DeviceTable, resource: str, ids: list[str], found: PodSurvey,
             steered: tuple[str, int | None] | None = None) -> Candidate:
    """The one pod these device IDs can belong to; refuses mismatches and disagreements.

    ``steered`` is the uid GetPreferredAllocation proposed exactly these IDs for, if any, and the
    position of the container it placed that pod on when it was one asked again (else None): it
    wins among equally consistent candidates, on that container.
    """
    if not ids:
        raise AllocationRefused(INVALID_ARGUMENT, f"{resource}: Allocate without device IDs")
    if len(set(ids)) != len(ids):
        repeated = [i for i, n in Counter(ids).items() if n > 1]
        raise AllocationRefused(INVALID_ARGUMENT, f"{resource}: duplicate device ID(s) {some_ids(repeated)} among "
                                f"the {len(ids)} asked for")
    card_of = _cards_of(table, resource, ids)
    cards = set(card_of.values())
    placed = [m for c in found.candidates if (m := _as_steered(c, len(ids), steered)) is not None]
    fits = [m for m in placed if cards <= m.cards]
    uid = steered[0] if steered is not None else None
    if not fits:
        # GetPreferredAllocation moved the pod off recorded cards the kubelet did not offer (only it
        # sees what is offered): the same move, onto exactly these devices, is that pod's
        for c in placed:
            if c.uid == uid:
                moved = relocation(table, resource, c, _by_card(card_of, ids), found)
                if moved is not None and set(moved[1]) == set(ids):
                    return moved[0]
        raise AllocationRefused(FAILED_PRECONDITION, f"{resource}: devices {some_ids(ids)} (card(s) "
                                f"{', '.join(sorted(cards))}) match no pod's allocation record on this node; "
                                f"candidates: {_explain(found)}")
    for c in fits:
        if c.uid == uid:
            return c
    if len({c.signature for c in fits}) > 1:
        raise AllocationRefused(FAILED_PRECONDITION, f"{resource}: devices {some_ids(ids)} fit several pods whose "
                                f"records disagree, refusing to guess: {'; '.join(c.describe() for c in fits)}")
    return fits[0]


def _as_steered(c: Candidate, size: int, steered: tuple[str, int | None] | None) -> Candidate | None:
    """``c`` placed on the container an Allocate of ``size`` devices is for: the one
    GetPreferredAllocation placed it on when it steered these devices to it as a container asked
    again (the Allocate that follows carries no ``must_include`` to tell), else :meth:`Candidate.at`."""
    if steered is not None and steered[0] == c.uid and steered[1] is not None:
        again = c.asked_again(steered[1], size)
        if again is not None:
            return again
    return c.at(size)


@dataclass(frozen=True)
class ContainerAnswer:
    envs: dict[str, str]
    dev_names: tuple[str, ...]   # /dev entries (names under /dev) the container needs


def container_answer(table: DeviceTable, resource: str, ids: list[str], cand: Candidate) -> ContainerAnswer:
    """Envs and device nodes for one container, from the devices and the pod's record.

    ``nvidia.com/gpu`` (and shared pods' memory/core) set NVIDIA_VISIBLE_DEVICES to the
    recorded card(s); shared pods get the MPS limits a runtime can enforce. Memory/core devices
    of a whole-GPU pod carry nothing: its ``nvidia.com/gpu`` devices already name the cards, and
    two resources setting the same variable would race in the kubelet's merge.
    """
    uuids = [u for u in cand.record.uuids if u in {table.card_of(resource, i).uuid for i in ids}]
    envs: dict[str, str] = {}
    if resource == RESOURCE_GPU or not cand.record.whole:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        envs["STOWAGE_POD"] = cand.ref
    if not cand.record.whole:
        if resource == RESOURCE_GPU_MEMORY:
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={len(ids) * table.memory_unit_mib}M"
        elif resource == RESOURCE_GPU_CORE:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(len(ids))
    if not envs:
        return ContainerAnswer({}, ())
    minors = [table.by_uuid[u].minor for u in uuids if table.by_uuid[u].minor >= 0]
    names = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools") + tuple(f"nvidia{m}" for m in minors)
    return ContainerAnswer(envs, names)
