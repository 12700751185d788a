"""KubeBinder against the fake API server, and the restart-rebuild claim (same model from the API server)."""
from __future__ import annotations

import json

import pytest
from extender_kube_helpers import FakeKube, gfd_node, inv_node, make_pod, new_feeder, row

from extender.errors import BindError, BindOutcomeUnknown
from extender.kube_binder import BindMayLand, KubeBinder
from packing.model import ClusterModel, PodAllocation
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, decode_allocation, encode_allocation
from stowage.resources import GpuRequest

GiB = 1024


@pytest.fixture(params=[True, False], ids=["direct-post", "client"])
def kube(request):
    """The fake API server; every test runs with the Binding's fast path (extender/kube_post.py)
    and with the ``kubernetes`` client's path it replaces: both must behave the same."""
    with FakeKube(bookmark_interval=3600) as k:
        k.direct = request.param
        yield k


def make_binder(kube: FakeKube, **kw) -> KubeBinder:
    b = KubeBinder(kube.api_client(), direct=kube.direct, **kw)
    assert (b.poster is not None) == kube.direct
    return b


def record(node: str, cards: list[int], mem: int = 80 * GiB, core: int = 1000, whole: bool = True) -> AllocationRecord:
    return AllocationRecord(node=node, whole=whole, cards=tuple(CardShare(k, f"GPU-{node}-{k}", mem, core) for k in cards))


def annotation(kube: FakeKube, name: str) -> str | None:
    return ((kube.get_pod("default", name)["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION))


def test_bind_is_one_binding_that_carries_the_record(kube):
    """One API write: the API server copies a Binding's annotations onto the pod in the same
    update that sets spec.nodeName, so the record and the binding exist together or not at all."""
    p = kube.create_pod(make_pod("p", gpus=2))
    rec = record("n1", [0, 3])
    make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1", rec)
    pod = kube.get_pod("default", "p")
    assert pod["spec"]["nodeName"] == "n1"
    assert decode_allocation(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == rec
    calls = [(m, path) for m, path, q in kube.requests]
    assert calls == [("POST", "/api/v1/namespaces/default/pods/p/binding")]
    body = kube.bodies[-1]
    assert body["metadata"]["uid"] == p["metadata"]["uid"]
    assert decode_allocation(body["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == rec


def test_bind_without_gpu_record_only_binds(kube):
    p = kube.create_pod(make_pod("cpu-only"))
    make_binder(kube).bind("default", "cpu-only", p["metadata"]["uid"], "n2", None)
    assert kube.get_pod("default", "cpu-only")["spec"]["nodeName"] == "n2"
    assert annotation(kube, "cpu-only") is None


def test_binding_conflict_removes_the_record_and_raises(kube):
    p = kube.create_pod(make_pod("p", gpus=1, node="elsewhere"))
    with pytest.raises(BindError) as err:
        make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [1]))
    assert 'already assigned to node "elsewhere"' in str(err.value)
    assert annotation(kube, "p") is None
    assert kube.get_pod("default", "p")["spec"]["nodeName"] == "elsewhere"


def test_binding_server_error_removes_the_record_with_the_api_message(kube):
    p = kube.create_pod(make_pod("p", gpu_memory=8))
    kube.fail_next(1, status=500, path="/binding$")
    with pytest.raises(BindError, match=r"injected failure \(500\)"):
        make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1",
                                           record("n1", [0], mem=8 * GiB, core=0, whole=False))
    pod = kube.get_pod("default", "p")
    assert annotation(kube, "p") is None and not pod["spec"].get("nodeName")


def test_uid_precondition_protects_a_recreated_pod(kube):
    old = kube.create_pod(make_pod("p", gpus=1))
    kube.delete_pod("default", "p")
    kube.create_pod(make_pod("p", gpus=1))  # same name, new uid
    with pytest.raises(BindError, match="re-created"):
        make_binder(kube).bind("default", "p", old["metadata"]["uid"], "n1", record("n1", [0]))
    pod = kube.get_pod("default", "p")
    assert annotation(kube, "p") is None and not pod["spec"].get("nodeName")
    assert [m for m, _, _ in kube.requests][:1] == ["POST"]  # the Binding's uid precondition refused it


def test_missing_pod_is_a_bind_error(kube):
    with pytest.raises(BindError, match="not found"):
        make_binder(kube).bind("default", "ghost", "", "n1", record("n1", [0]))


def test_a_retried_bind_of_an_already_bound_pod_succeeds(kube):
    """The first Binding went through but its answer was lost: the retry sees 409, reads back, succeeds."""
    p = kube.create_pod(make_pod("p", gpus=1))
    b = make_binder(kube)
    rec = record("n1", [2])
    b.bind("default", "p", p["metadata"]["uid"], "n1", rec)
    b.bind("default", "p", p["metadata"]["uid"], "n1", rec)
    assert decode_allocation(annotation(kube, "p")) == rec


def test_a_failed_binding_writes_nothing(kube):
    """A record someone else wrote stays as it is when our Binding fails: nothing to roll back."""
    p = kube.create_pod(make_pod("p", gpus=1))
    other = encode_allocation(record("n9", [5]))
    kube.patch_pod("default", "p", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: other}}})
    kube.fail_next(1, status=500, path="/binding$")
    before = len(kube.requests)
    with pytest.raises(BindError, match=r"injected failure \(500\)"):
        make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [0]))
    assert annotation(kube, "p") == other
    assert [m for m, _, _ in kube.requests[before:]] == ["POST", "GET"]  # the Binding, then the read-back


def test_bound_there_without_our_record_is_not_a_success(kube):
    """The Binding answered 409 and the pod is on our node, but someone else bound it (no record
    of ours on it): the device plugin would find no cards for it, so this bind failed."""
    p = kube.create_pod(make_pod("p", gpus=1, node="n1"))
    with pytest.raises(BindError, match="without this allocation record"):
        make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [0]))
    assert annotation(kube, "p") is None


def test_lost_answer_of_a_binding_that_went_through_is_a_success(kube):
    """The connection breaks after the API server applied the Binding: the read-back finds the pod
    bound to our node with our record."""
    p = kube.create_pod(make_pod("p", gpus=1))
    binder = make_binder(kube)
    real_binding = binder._binding

    def binding_then_lost(*args, **kw):
        real_binding(*args, **kw)
        raise ConnectionResetError("connection reset by peer")

    binder._binding = binding_then_lost
    rec = record("n1", [1])
    binder.bind("default", "p", p["metadata"]["uid"], "n1", rec)
    assert decode_allocation(annotation(kube, "p")) == rec


def _snapshot(model: ClusterModel) -> tuple[dict, dict]:
    """Card holders and node rows. (Pods holding host room only are compared apart: the test's
    own release of a failed bind's reservation takes back what the feed had already recorded.)"""
    allocs = {uid: (a.name, a.node, a.cards, a.mem_mib, a.core_milli, a.whole, a.applied)
              for uid, a in model.allocations.items() if a.cards}
    rows = {n: row(model, n) for n in model.node_names()}
    return allocs, rows


def _record_of(model: ClusterModel, alloc: PodAllocation) -> AllocationRecord:
    return AllocationRecord(node=alloc.node, whole=alloc.whole, cards=tuple(
        CardShare(k, model.card_uuid(alloc.node, k), m, c) for k, m, c in zip(alloc.cards, alloc.mem_mib, alloc.core_milli)))


def _first_fit(model: ClusterModel, req: GpuRequest) -> tuple[str, list[int]]:
    """A plain first-fit card choice for the test (the real placers live in packing.strategies)."""
    a = model.a
    for node in sorted(model.node_names()):
        i = model.index[node]
        if req.is_whole:
            free = [k for k in range(a.shape[1]) if a.exists[i, k] and a.healthy[i, k] and a.pods[i, k] == 0
                    and a.mem_total[i, k] >= req.min_card_mem_mib]
            if len(free) >= req.gpus:
                return node, free[:req.gpus]
        else:
            for k in range(a.shape[1]):
                if a.exists[i, k] and a.mem_total[i, k] > 0 and a.mem_free[i, k] >= req.mem_mib \
                        and a.core_free[i, k] >= req.core_milli:
                    return node, [k]
    raise AssertionError(f"no room for {req}")


def test_restart_rebuilds_exactly_the_same_model(kube):
    kube.create_node(inv_node("a100", [80, 80, 80, 80]))
    kube.create_node(inv_node("mixed", [40, 24, 24]))
    kube.create_node(gfd_node("a10", 2))
    first = new_feeder(kube).start()
    try:
        kube.wait_for(lambda: first.ready()[0])
        model = first.model
        binder = make_binder(kube)
        asks = [("train", GpuRequest(gpus=2)), ("infer-1", GpuRequest(mem_mib=10 * GiB, core_milli=300)),
                ("infer-2", GpuRequest(mem_mib=20 * GiB, core_milli=500)), ("one", GpuRequest(gpus=1)),
                ("infer-3", GpuRequest(mem_mib=30 * GiB)), ("big", GpuRequest(gpus=2)),
                ("infer-4", GpuRequest(mem_mib=4 * GiB, core_milli=100)), ("gone", GpuRequest(gpus=1)),
                ("finished", GpuRequest(mem_mib=8 * GiB))]
        uids = {}
        for name, req in asks:
            limits = {"gpus": req.gpus} if req.is_whole else {"gpu_memory": req.mem_mib // GiB,
                                                              "gpu_core": req.core_milli // 10}
            pod = kube.create_pod(make_pod(name, **limits))
            uid = uids[name] = pod["metadata"]["uid"]
            with model.lock:  # what the service's bind does: choose + reserve atomically
                node, cards = _first_fit(model, req)
                alloc = model.assign(uid, f"default/{name}", node, cards, req, check=True)
                rec = _record_of(model, alloc)
            binder.bind("default", name, uid, node, rec)
        kube.update("pods", "default", "finished", lambda o: o["status"].update(phase="Succeeded"))
        kube.delete_pod("default", "gone")
        # A bind that fails leaves nothing behind in either model.
        loser = kube.create_pod(make_pod("loser", gpus=1, node="someone-else"))  # bound meanwhile
        with model.lock:
            node, cards = _first_fit(model, GpuRequest(gpus=1))
            alloc = model.assign(loser["metadata"]["uid"], "default/loser", node, cards, GpuRequest(gpus=1))
            rec = _record_of(model, alloc)
        with pytest.raises(BindError):
            binder.bind("default", "loser", loser["metadata"]["uid"], node, rec)
        model.release(loser["metadata"]["uid"])  # the service releases its reservation on BindError
        kube.wait_for(lambda: uids["gone"] not in model.allocations and uids["finished"] not in model.allocations)
        kube.create_pod(make_pod("marker"))
        kube.wait_for(lambda: first.pending_pod("default", "marker") is not None)  # feed caught up (no GET)
        before = _snapshot(model)
    finally:
        first.stop()
    assert set(before[0]) == {uids[n] for n in ("train", "infer-1", "infer-2", "one", "infer-3", "big", "infer-4")}
    assert any(r["pods"] != [0] * len(r["pods"]) for r in before[1].values())

    second = new_feeder(kube, model=ClusterModel())
    try:
        second.start()
        kube.wait_for(lambda: second.ready()[0])
        after = _snapshot(second.model)
    finally:
        second.stop()
    assert after == before
    hosts = {u: (a.node, a.cpu_milli, a.host_mem_mib) for u, a in second.model.allocations.items() if not a.cards}
    assert set(hosts) == {loser["metadata"]["uid"]}   # bound elsewhere, record not honoured: host room only
    # And the records on the pods are what both models say.
    for uid, (name, node, cards, mems, cores, whole, _) in after[0].items():
        rec = decode_allocation(annotation(kube, name.split("/")[1]))
        assert (rec.node, tuple(c.index for c in rec.cards), tuple(c.memory_mib for c in rec.cards),
                tuple(c.core_milli for c in rec.cards), rec.whole) == (node, cards, mems, cores, whole)
    assert json.loads(annotation(kube, "train"))["whole"] is True


def test_unknown_outcome_is_said_and_a_refusal_is_not(kube):
    """Lost answer and the pod unreadable: maybe bound (BindOutcomeUnknown: the service keeps the
    cards). A 4xx refusal with the pod unreadable: nothing was applied (a plain BindError)."""
    p = kube.create_pod(make_pod("p", gpus=1))
    binder = make_binder(kube, readback_attempts=1, readback_delay_s=0)

    def unreadable(namespace, name):
        raise ConnectionRefusedError("API server unreachable")

    binder._read = unreadable
    real_binding = binder._binding

    def lost(*args, **kw):
        raise ConnectionResetError("connection reset by peer")

    binder._binding = lost
    with pytest.raises(BindOutcomeUnknown, match="whether it was bound is unknown"):
        binder.bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [0]))
    binder._binding = real_binding
    kube.fail_next(1, status=403, path="/binding$")
    with pytest.raises(BindError) as err:
        binder.bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [0]))
    assert not isinstance(err.value, BindOutcomeUnknown)



@pytest.mark.parametrize("status", [500, 503, 504])
def test_a_5xx_with_the_pod_read_back_unbound_may_still_land(kube, status):
    """A 5xx does not say the Binding was not applied (kube-apiserver's timeout filter answers 504
    while the storage update goes on; etcd's "request timed out" is a 500 whose proposal may still
    commit): read back unbound, it is BindMayLand, an outcome unknown (the service keeps the cards)."""
    p = kube.create_pod(make_pod("p", gpus=1))
    kube.hold_bindings(1, status=status, reason="Timeout")
    with pytest.raises(BindMayLand, match=f"{status}.*may still apply the Binding"):
        make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [0]))
    assert kube.apply_held()[0]["code"] == 201           # ... and so it can be


@pytest.mark.parametrize("status", [403, 422, 429])
def test_a_4xx_with_the_pod_read_back_unbound_is_a_plain_refusal(kube, status):
    """A 4xx (429 included: priority and fairness sheds a request before it is handled) applied nothing."""
    p = kube.create_pod(make_pod("p", gpus=1))
    kube.fail_next(1, status=status, path="/binding$")
    with pytest.raises(BindError) as err:
        make_binder(kube).bind("default", "p", p["metadata"]["uid"], "n1", record("n1", [0]))
    assert not isinstance(err.value, BindOutcomeUnknown)


# ----------------------------------------------------------------- the Binding's fast path
@pytest.fixture
def fake():
    with FakeKube(bookmark_interval=3600) as k:
        k.direct = True
        yield k


def test_the_fast_path_sends_the_document_the_client_sends(fake):
    """The same Binding through both paths: the same URL, the same JSON document (the client
    leaves out what is None and sends no apiVersion/kind for a V1Binding: the API server fills
    those in), so the API server cannot tell them apart."""
    kube = fake
    rec = record("n1", [1, 2])
    sent = []
    for direct in (True, False):
        p = kube.create_pod(make_pod(f"p{int(direct)}", gpus=2))
        KubeBinder(kube.api_client(), direct=direct).bind("default", f"p{int(direct)}", p["metadata"]["uid"], "n1", rec)
        body = kube.bodies[-1]
        body.pop("apiVersion", None)
        body.pop("kind", None)
        for key in ("name", "uid"):
            body["metadata"].pop(key)
        sent.append((kube.requests[-1][1].replace(f"p{int(direct)}", "P"), body))
    assert sent[0] == sent[1]


def test_a_kept_alive_connection_the_server_closed_is_replaced(fake):
    """The API server closes idle connections: the next Binding is sent again on a new connection
    and is applied once."""
    import socket

    kube = fake
    b = make_binder(kube)
    real_connect = b.poster._connect
    connects = []
    b.poster._connect = lambda timeout: connects.append(timeout) or real_connect(timeout)
    first = kube.create_pod(make_pod("a", gpus=1))
    b.bind("default", "a", first["metadata"]["uid"], "n1", record("n1", [0]))
    conn = b.poster._local.conn
    assert conn is not None and conn.sock is not None  # kept alive
    ours, theirs = socket.socketpair()
    theirs.close()                 # what a server that closed the connection looks like
    conn.sock.close()
    conn.sock = ours
    p = kube.create_pod(make_pod("b", gpus=1))
    before = len(kube.requests)
    b.bind("default", "b", p["metadata"]["uid"], "n1", record("n1", [1]))
    assert kube.get_pod("default", "b")["spec"]["nodeName"] == "n1"
    assert [m for m, _, _ in kube.requests[before:]] == ["POST"]   # applied once, no read-back needed
    assert len(connects) == 2                                        # the first, then the new one


def test_the_fast_path_reads_the_credentials_each_request(fake):
    """A refreshed token (the service account's projected token, an exec plugin's) is used from the
    next Binding on, as the client would: the header comes from the configuration each time."""
    kube = fake
    api = kube.api_client()
    tokens = iter(["Bearer one", "Bearer two"])
    api.configuration.api_key = {"authorization": "x"}
    api.configuration.refresh_api_key_hook = lambda cfg: cfg.api_key.update(authorization=next(tokens))
    b = KubeBinder(api)
    seen = []
    real = b.poster._headers

    def spy():
        h = real()
        seen.append(h.get("authorization"))
        return h

    b.poster._headers = spy
    for name in ("a", "b"):
        p = kube.create_pod(make_pod(name, gpus=1))
        b.bind("default", name, p["metadata"]["uid"], "n1", record("n1", [0]))
    assert seen == ["Bearer one", "Bearer two"]


def test_settings_the_fast_path_does_not_implement_keep_the_clients_path():
    """A proxy or a TLS server-name override: the binder keeps the client's own path."""
    import kubernetes.client

    from extender.kube_post import direct_poster

    for setting in ({"proxy": "http://proxy:3128"}, {"tls_server_name": "kubernetes"},
                    {"assert_hostname": False}):
        cfg = kubernetes.client.Configuration()
        cfg.host = "https://10.0.0.1:6443"
        for k, v in setting.items():
            setattr(cfg, k, v)
        assert direct_poster(kubernetes.client.ApiClient(cfg)) is None, setting
    cfg = kubernetes.client.Configuration()
    cfg.host = "https://10.0.0.1:6443"
    assert direct_poster(kubernetes.client.ApiClient(cfg)) is not None


def test_a_connection_idle_too_long_is_replaced_before_use(fake, monkeypatch):
    """kube-apiserver closes idle connections: one idle past MAX_IDLE_S is not even tried."""
    from extender import kube_post

    kube = fake
    b = make_binder(kube)
    real_connect = b.poster._connect
    connects = []
    b.poster._connect = lambda timeout: connects.append(timeout) or real_connect(timeout)
    clock = [1000.0]
    monkeypatch.setattr(kube_post.time, "monotonic", lambda: clock[0])
    for name, dt in (("a", 0.0), ("b", 1.0), ("c", kube_post.MAX_IDLE_S + 1)):
        clock[0] += dt
        p = kube.create_pod(make_pod(name, gpus=1))
        b.bind("default", name, p["metadata"]["uid"], "n1", record("n1", [0]))
    assert len(connects) == 2   # a: new; b: kept alive; c: idle too long, replaced


HOSTILE_READ_BACKS = [[], "pod", 7, {"metadata": "m"}, {"metadata": {"uid": "U"}, "spec": ["n1"]},
                      {"metadata": {"uid": "U", "annotations": "a"}, "spec": {"nodeName": "n1"}},
                      {"metadata": {"uid": ["U"]}, "spec": {}}]


@pytest.mark.parametrize("read_back", HOSTILE_READ_BACKS,
                         ids=["list", "text", "number", "meta-text", "spec-list", "annotations-text", "uid-list"])
def test_a_read_back_of_no_pod_shape_after_a_5xx_leaves_the_outcome_unknown(kube, read_back):
    """The Binding was answered 504 and the read-back answered something that is not a pod (a
    proxy's page as JSON, a peer that lies). Before, it raised AttributeError or was taken for
    "not this pod": a plain failure, so the service released the cards while the Binding could
    still land. It proves nothing: the outcome stays unknown (the cards stay reserved)."""
    p = kube.create_pod(make_pod("p", gpus=1))
    uid = p["metadata"]["uid"]
    binder = make_binder(kube, readback_attempts=1, readback_delay_s=0)
    shaped = json.loads(json.dumps(read_back).replace('"U"', json.dumps(uid)))
    binder._read = lambda namespace, name: shaped
    kube.hold_bindings(1, status=504, reason="Timeout")
    with pytest.raises(BindOutcomeUnknown, match="504"):
        binder.bind("default", "p", uid, "n1", record("n1", [0]))
    assert kube.apply_held()[0]["code"] == 201           # ... and it could land


@pytest.mark.parametrize("read_back", HOSTILE_READ_BACKS[:4], ids=["list", "text", "number", "meta-text"])
def test_a_bind_without_uid_of_a_pod_read_as_no_pod_shape_is_a_bind_error(kube, read_back):
    """Without the uid in the request the binder reads the pod first: an answer that is not a pod
    is a BindError for this bind (before: AttributeError), and no Binding is sent."""
    kube.create_pod(make_pod("p", gpus=1))
    binder = make_binder(kube)
    binder._read = lambda namespace, name: read_back
    with pytest.raises(BindError, match="not a pod"):
        binder.bind("default", "p", "", "n1", record("n1", [0]))
    assert not kube.get_pod("default", "p")["spec"].get("nodeName")
