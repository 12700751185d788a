"""The extender's preempt verb (kube-scheduler's ProcessPreemption) and the hold of nominated
pods' cards, over the real Flask app and on the service, with bodies in both wire forms."""
from __future__ import annotations

import json

import pytest

from extender.service import ExtenderService
from extender.wire import ExtenderArgs, BindingArgs, WireError, parse_preemption_args
from packing.model import ClusterModel
from stowage.resources import GpuRequest

from extender_harness import Server, relay_to
from fakekube import make_pod
from planning_clusters import GiB, add_node


def cluster() -> ClusterModel:
    """right: 2 x 24 GiB, card 0 holds a1+a2 (12 GiB each), card 1 holds a3+a4.
    wrong: same shape, H100-less model "L4" too; b1..b4 the same way. h100: 1 x 80 GiB H100, h1 (60 GiB)."""
    m = ClusterModel()
    for node in ("right", "wrong"):
        add_node(m, node, 2, 24, "L4")
    add_node(m, "h100", 1, 80, "H100")
    for j, card in enumerate((0, 0, 1, 1), start=1):
        m.assign(f"a{j}", f"default/a{j}", "right", [card], GpuRequest(mem_mib=12 * GiB))
        m.assign(f"b{j}", f"default/b{j}", "wrong", [card], GpuRequest(mem_mib=12 * GiB))
    m.assign("h1", "default/h1", "h100", [0], GpuRequest(mem_mib=60 * GiB))
    return m


def preemptor(name: str = "hi", gib: int = 20, priority: int = 1000, **ann: str) -> dict:
    pod = make_pod(name, gpu_memory=gib, uid=f"uid-{name}", annotations={f"stowage.io/{k}": v for k, v in ann.items()})
    pod["spec"]["priority"] = priority
    return pod


def meta_body(pod: dict, victims: dict[str, list[str]], pdb: int = 0) -> dict:
    return {"Pod": pod, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb} for n, uids in victims.items()}}


@pytest.fixture
def server():
    svc = ExtenderService(cluster())
    with Server(svc) as srv:
        yield srv


def answer(resp) -> dict[str, tuple[list[str], int]]:
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert set(doc) == {"NodeNameToMetaVictims"}
    return {n: ([p["UID"] for p in v["Pods"]], v["NumPDBViolations"]) for n, v in doc["NodeNameToMetaVictims"].items()}


def test_meta_victims_keep_the_node_whose_victims_free_one_card(server):
    before = server.get("/state").json()
    got = answer(server.post("/preempt", meta_body(preemptor(), {"right": ["a1", "a2"], "wrong": ["b1", "b3"]})))
    # a1+a2 free card 0 of right (24 GiB >= 20); b1+b3 leave 12 GiB on each card of wrong
    assert got == {"right": (["a1", "a2"], 0)}
    after = server.get("/state").json()
    # A what-if: nothing booked or released (the preemptor is learned, as at filter: "learned" moves).
    assert {k: after[k] for k in ("nodes", "allocations")} == {k: before[k] for k in ("nodes", "allocations")}


def test_model_constrained_pod_drops_nodes_of_another_model(server):
    body = meta_body(preemptor(**{"gpu-model": "H100"}), {"right": ["a1", "a2"], "h100": ["h1"]})
    assert answer(server.post("/preempt", body)) == {"h100": (["h1"], 0)}
    body = meta_body(preemptor(**{"gpu-model": "A100"}), {"right": ["a1", "a2"], "h100": ["h1"]})
    assert answer(server.post("/preempt", body)) == {}


def test_full_victims_form_uses_the_pods_priorities_and_returns_the_meta_form(server):
    # 10 GiB needed: any one pod of a card frees enough; the lowest priority one is chosen
    pods = []
    for uid, prio in (("a1", 50), ("a2", 10), ("a3", 30)):
        p = make_pod(uid, gpu_memory=12, uid=uid, node="right")
        p["spec"]["priority"] = prio
        pods.append(p)
    body = {"Pod": preemptor(gib=10), "NodeNameToVictims": {"right": {"Pods": pods, "NumPDBViolations": 2}}}
    assert answer(server.post("/preempt", body)) == {"right": (["a2"], 1)}  # PDB bound: min(2, 1)


def test_meta_victims_take_priorities_from_the_watch(server):
    svc = server.service
    for uid, prio in (("a1", 50), ("a2", 10), ("a3", 5), ("a4", 70)):
        p = make_pod(uid, gpu_memory=12, uid=uid, node="right")
        p["spec"]["priority"] = prio
        svc.marks.note(p)
    got = answer(server.post("/preempt", meta_body(preemptor(gib=10), {"right": ["a1", "a2", "a3", "a4"]}, pdb=3)))
    assert got == {"right": (["a3"], 1)}


def test_victims_without_cards_are_kept_and_empty_nodes_are_not_answered(server):
    got = answer(server.post("/preempt", meta_body(preemptor(), {"right": ["cpu-pod", "a1", "a2"], "wrong": []})))
    assert got == {"right": (["cpu-pod", "a1", "a2"], 0)}


def test_pod_stowage_cannot_place_gets_no_node_and_cpu_pod_keeps_the_proposal(server):
    bad = preemptor(**{"gpu-topology": "sideways"})
    assert answer(server.post("/preempt", meta_body(bad, {"right": ["a1", "a2"]}))) == {}
    cpu = make_pod("cpu", uid="uid-cpu")
    assert answer(server.post("/preempt", meta_body(cpu, {"right": ["a1"]}, pdb=1))) == {"right": (["a1"], 1)}


@pytest.mark.parametrize("body,needle", [
    (b"[]", "JSON object"),
    (b"{}", "'Pod' must be a Pod object"),
    ({"Pod": {}, "NodeNameToMetaVictims": []}, "must be an object mapping"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": 3}}, "NodeNameToMetaVictims['n'] must be an object"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": {}}}}, "Pods must be a list"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"uid": 7}]}}}, "has no UID"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": ["x"]}}}, "must be an object"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": -1}}}, "non-negative integer"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": True}}}, "non-negative integer"),
    ({"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {}}]}}}, "has no metadata.uid"),
])
def test_hostile_bodies_get_a_clear_400(server, body, needle):
    resp = server.post("/preempt", data=body) if isinstance(body, bytes) else server.post("/preempt", body)
    assert resp.status_code == 400
    assert needle in resp.json()["Error"]


def test_keys_match_case_insensitively_like_go_and_duplicates_are_one_pod():
    args = parse_preemption_args(json.dumps({"pod": {}, "nodenametometavictims": {
        "n": {"pods": [{"uid": "x"}, {"UID": "x"}], "numpdbviolations": 1}}}))
    assert args.meta and args.victims["n"].uids == ["x"] and args.victims["n"].num_pdb_violations == 1
    with pytest.raises(WireError):
        parse_preemption_args(b"not json")


def test_oversized_body_is_refused_before_reading(server):
    svc = server.service
    with Server(svc, max_body_bytes=1000) as small:
        resp = small.post("/preempt", meta_body(preemptor(), {f"n{j}": [f"u{j}"] for j in range(100)}))
        assert resp.status_code == 413


def test_not_ready_model_answers_no_node():
    svc = ExtenderService(cluster())
    with Server(svc, ready=lambda: (False, "pods not listed yet")) as srv:
        assert answer(srv.post("/preempt", meta_body(preemptor(), {"right": ["a1", "a2"]}))) == {}
        assert srv.post("/preempt", data=b"{}").status_code == 400


def test_internal_error_answers_no_node(server, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(server.service, "preempt", boom)
    assert answer(server.post("/preempt", meta_body(preemptor(), {"right": ["a1", "a2"]}))) == {}


# ------------------------------------------------------------------------------ nominated pods
def nominate(svc: ExtenderService, name: str, node: str, gib: int, priority: int) -> dict:
    pod = preemptor(name, gib=gib, priority=priority)
    pod["status"]["nominatedNodeName"] = node
    svc.marks.note(pod)
    return pod


def filter_names(svc: ExtenderService, pod: dict, names: list[str]):
    return svc.filter(ExtenderArgs(pod=pod, node_names=names, nodes=None, names=names))


def test_freed_cards_are_held_for_the_nominated_pod_against_lower_priorities():
    m = cluster()
    m.release("a1")
    m.release("a2")  # the victims are gone: card 0 of right has 24 GiB free
    svc = ExtenderService(m)
    nom = nominate(svc, "hi", "right", 20, 1000)
    low = preemptor("low", gib=8, priority=10)
    res = filter_names(svc, low, ["right"])
    assert res.node_names == [] and "cards held for default/hi" in res.failed["right"]
    # the nominee itself, and a pod of higher priority, still see the node as feasible
    assert filter_names(svc, nom, ["right"]).node_names == ["right"]
    assert filter_names(svc, preemptor("top", gib=8, priority=5000), ["right"]).node_names == ["right"]
    # bind agrees with filter
    svc.pod_info(low)
    svc.marks.note(low)
    err = svc.bind(BindingArgs("low", "default", "uid-low", "right"))
    assert "cards held for default/hi" in err
    # a small pod that fits beside the nominee is not refused
    tiny = preemptor("tiny", gib=4, priority=10)
    assert filter_names(svc, tiny, ["right"]).node_names == ["right"]
    svc.pod_info(tiny)
    assert svc.bind(BindingArgs("tiny", "default", "uid-tiny", "right")) == ""
    assert m.allocations["uid-tiny"].cards == (0,)  # card 1 is full; 20 GiB of card 0 stay free
    assert svc.bind(BindingArgs("hi", "default", "uid-hi", "right")) == ""
    assert m.allocations["uid-hi"].cards == (0,)
    # once bound, it is no longer nominated: the hold ends with the pod's nomination
    bound = dict(nom, spec=dict(nom["spec"], nodeName="right"))
    svc.marks.note(bound)
    assert not svc.marks.any_nominated()


def test_nominee_whose_victims_still_hold_the_cards_holds_nothing_yet():
    svc = ExtenderService(cluster())
    nominate(svc, "hi", "right", 20, 1000)
    # right is full; a lower-priority pod is refused by the cards as before, with the usual reason
    res = filter_names(svc, preemptor("low", gib=12, priority=10), ["right"])
    assert "cards held" not in res.failed["right"]


def test_marks_forget_deleted_and_relisted_pods():
    svc = ExtenderService(cluster())
    nom = nominate(svc, "hi", "right", 20, 1000)
    assert svc.marks.nominees("right", 0) and svc.marks.priority("uid-hi") == 1000
    svc.marks.note(nom, gone=True)
    assert not svc.marks.any_nominated() and svc.marks.priority("uid-hi") is None
    nominate(svc, "hi", "right", 20, 1000)
    svc.marks.keep_only([])
    assert not svc.marks.any_nominated()
    # hostile objects never raise
    for odd in ({}, {"metadata": []}, {"metadata": {"uid": 5}}, {"metadata": {"uid": "x"}, "spec": {"priority": "9"}},
                {"metadata": {"uid": "y"}, "status": {"nominatedNodeName": 3}}):
        svc.marks.note(odd)
    assert svc.marks.priority("x") == 0


def test_split_layout_relays_preempt_like_the_one_process_app(tmp_path):
    """The split layout's workers hand /preempt to the decision process as a verb of its own:
    the answer is the one-process app's, byte for byte, and counted under verb="preempt"."""
    from extender.app import create_app
    from extender.frontend import create_frontend
    from extender.relay import OPS
    from werkzeug.test import Client

    body = meta_body(preemptor(), {"right": ["a1", "a2"], "wrong": ["b1", "b3"]})
    app = create_app(ExtenderService(cluster()))
    direct = Client(app).post("/preempt", json=body)
    with relay_to(app, tmp_path):
        front = Client(create_frontend(str(tmp_path / "relay.sock"), max_body_bytes=1 << 20))
        relayed = front.post("/preempt", json=body)
        assert relayed.status_code == 200 and relayed.data == direct.data
        assert json.loads(relayed.data)["NodeNameToMetaVictims"].keys() == {"right"}
        assert OPS["preempt"] not in (OPS["filter"], OPS["prioritize"], OPS["bind"])
        metrics = Client(app).get("/metrics").data
        assert b'stowage_extender_requests_total{outcome="ok",verb="preempt"} 2.0' in metrics


def test_a_huge_preempt_request_is_bounded_by_the_trial_budget():
    """Every node of a cluster with all its pods as victims: examined until the trial budget is
    spent; the nodes past it are dropped (never evicted on), the answers before it are right."""
    m = ClusterModel()
    for j in range(60):
        add_node(m, f"n{j}", 8, 80, "A100")
        for k in range(8):
            for q in range(6):
                m.assign(f"n{j}-{k}-{q}", f"default/p{j}-{k}-{q}", f"n{j}", [k], GpuRequest(mem_mib=12 * GiB))
    svc = ExtenderService(m)
    svc.preempt_budget = 600
    victims = {f"n{j}": [f"n{j}-{k}-{q}" for k in range(8) for q in range(6)] for j in range(60)}
    pod = make_pod("big", gpus=2, uid="uid-big")
    pod["spec"]["priority"] = 10
    got = svc.preempt(parse_preemption_args(meta_body(pod, victims)))
    assert 0 < len(got) < 60  # the budget ran out part way: the rest were not examined, so dropped
    for node, (uids, _) in got.items():
        assert set(uids) <= set(victims[node]) and len(uids) == 12  # two whole cards of 6 pods each


def test_a_preempt_request_is_bounded_in_victims_as_well_as_fits(monkeypatch):
    """The trial budget counted fits, not the victims a node was proposed with: each one is read
    under the model's lock, so one node proposed with 1,000,000 made-up victims (a 17 MiB body)
    held the lock ~4 s (filter and bind waited; kube-scheduler's httpTimeout is 5 s), and the
    256 MiB a body may be ~60 s. Now a request examines at most ``preempt_victims`` proposed
    victims in all; a node whose victims pass what is left is dropped unexamined (no eviction)."""
    import extender.service as service_module

    svc = ExtenderService(cluster())
    svc.preempt_victims = 1000
    examined: list[tuple[str, int]] = []
    judge = service_module.judge_node

    def counted(model, node, req, policy, victims, *args, **kw):
        examined.append((node, len(victims)))
        return judge(model, node, req, policy, victims, *args, **kw)

    monkeypatch.setattr(service_module, "judge_node", counted)
    flood = ["b1", "b3"] + [f"made-up-{j}" for j in range(5000)]
    body = meta_body(preemptor(), {"right": ["a1", "a2"], "wrong": flood, "h100": ["h1"]})
    got = svc.preempt(parse_preemption_args(body))
    assert [node for node, _ in examined] == ["right", "h100"]
    assert sum(n for _, n in examined) <= svc.preempt_victims
    assert got["right"] == (["a1", "a2"], 0) and "wrong" not in got


# ------------------------------------------------------------------- bodies that lie (audit)
def test_victims_that_hold_no_cards_on_the_node_free_none_there(server):
    """Victims the model places on another node, unknown ones and the preemptor itself hold no
    cards on the node named: they never make it fit (``wrong`` is full of b-pods), and are kept
    only beside victims that do free cards there. The verb books nothing either way."""
    before = server.get("/state").json()
    body = meta_body(preemptor(), {"wrong": ["a1", "a2", "uid-hi", "ghost"],
                                   "right": ["b1", "uid-hi", "a1", "a2", "a1"]})
    assert answer(server.post("/preempt", body)) == {"right": (["b1", "uid-hi", "a1", "a2"], 0)}
    after = server.get("/state").json()
    assert {k: after[k] for k in ("nodes", "allocations")} == {k: before[k] for k in ("nodes", "allocations")}


def test_a_second_nomination_moves_the_hold_and_no_hold_outlives_it():
    """Preempting twice for one pod holds nothing of the first answer: the hold follows the
    pod's nominatedNodeName, to the new node, and ends when the pod finishes."""
    m = cluster()
    m.release("a1")
    m.release("a2")
    svc = ExtenderService(m)
    nom = nominate(svc, "hi", "right", 20, 1000)
    low = preemptor("low", gib=8, priority=10)
    assert filter_names(svc, low, ["right"]).node_names == []
    nominate(svc, "hi", "h100", 20, 1000)             # kube-scheduler nominated it elsewhere
    assert filter_names(svc, low, ["right"]).node_names == ["right"]
    assert "cards held for default/hi" in filter_names(svc, preemptor("low2", gib=8, priority=10),
                                                       ["h100"]).failed["h100"]
    svc.marks.note(dict(nom, status={"phase": "Succeeded", "nominatedNodeName": "h100"}), gone=True)
    assert not svc.marks.any_nominated()
    assert filter_names(svc, preemptor("low3", gib=8, priority=10), ["h100"]).node_names == ["h100"]


def test_the_watch_moves_and_ends_a_nomination_in_kube_mode():
    """The same through the Kubernetes feed as ``stowage extender`` wires it: the hold starts when
    the pod's nominatedNodeName arrives, and ends when the pod is deleted."""
    from extender.cli import connect_feed
    from extender_kube_helpers import inv_node, new_feeder
    from fakekube import FakeKube

    with FakeKube(bookmark_interval=3600) as kube:
        kube.create_node(inv_node("n", [24]))
        f = new_feeder(kube)
        svc = ExtenderService(f.model)
        connect_feed(f, svc)
        f.start()
        try:
            kube.wait_for(lambda: f.ready()[0])
            hi = make_pod("hi", gpu_memory=20)
            hi["spec"]["priority"] = 1000
            kube.create_pod(hi)
            kube.update("pods", "default", "hi", lambda o: o["status"].update(nominatedNodeName="n"))
            kube.wait_for(svc.marks.any_nominated)
            low = preemptor("low", gib=8, priority=10)
            assert "cards held for default/hi" in filter_names(svc, low, ["n"]).failed["n"]
            kube.delete_pod("default", "hi")
            kube.wait_for(lambda: not svc.marks.any_nominated())
            assert filter_names(svc, low, ["n"]).node_names == ["n"]
        finally:
            f.stop()


@pytest.mark.parametrize("where", ["node", "uid"])
def test_a_preempt_body_with_a_name_no_kubernetes_object_has_is_refused_in_a_short_message(where):
    """As for bind: a node name or victim UID of megabytes is no object's, and went whole into the
    error answered (and the log line that quotes it)."""
    big = "x" * 100_000
    node, uid = (big, "u1") if where == "node" else ("n1", big)
    body = json.dumps({"Pod": {}, "NodeNameToMetaVictims": {node: {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}})
    with pytest.raises(WireError) as err:
        parse_preemption_args(body)
    assert "253" in str(err.value) and len(str(err.value)) < 200, str(err.value)[:300]
