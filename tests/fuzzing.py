"""Adversarial requests against the extender as deployed (gunicorn, both serving layouts).

Each request is a captured kube-scheduler body (``../shared/wire``, or a built-in pod when that
is absent) mutated the way an attacker or a broken client would: leaves replaced by hostile
values (NaN, 1e400, 2**70, huge strings, wrong types, deep nesting), keys dropped or added, node
name lists that are huge, duplicated or not strings, bodies that are not JSON at all, and binds of
random pods to random (and real) nodes. The run passes when every answer is a 2xx/4xx (never a 5xx),
no request hangs, the server's log has no traceback, its memory stays bounded, and no card ended up
with more than it holds (the model's own invariants, read from /state).

    python tests/fuzzing.py --per-verb 10000 [--workers 2]    # the issue 12 run (docs/security.md)

``tests/test_extender_fuzz.py`` runs a few hundred per verb in both layouts on every ``make test``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

WIRE = HERE.parent.parent / "shared" / "wire" / "node-cache"
NODES = ["a100-80g-01", "a100-80g-02", "h100-01", "t4-01", "l4-01"]   # in the built-in cluster (some)

HOSTILE = [None, True, False, 0, -1, 1.5, 1e308, -1e308, 2 ** 70, -(2 ** 70), "", "NaN", "Infinity", "-Infinity",
           "1e400", "99999999999999999999999", "80_000", "0x10", " 4", "4Gi ", "-4", "1.5", "8e1", "\u0000",
           "\ud7ff" * 10, "a" * 5000, "💥" * 100, [], [1, 2], {}, {"a": {"b": {"c": None}}}]
KEYS = ["nvidia.com/gpu", "nvidia.com/gpu-memory", "nvidia.com/gpu-core", "cpu", "memory",
        "stowage.io/node-policy", "stowage.io/card-policy", "stowage.io/gpu-model", "stowage.io/gpu-model-exclude",
        "stowage.io/min-card-memory", "stowage.io/gpu-topology", "stowage.io/allocation", "stowage.io/bogus"]


def hostile(rng: random.Random, extra: list | None = None) -> Any:
    """A hostile value, copied: the same list or dict inserted twice and then mutated would make
    the body a cycle (no JSON at all)."""
    return copy.deepcopy(rng.choice(HOSTILE + (extra or [])))


def base_pods() -> list[dict]:
    pods = []
    if WIRE.is_dir():
        for f in sorted(WIRE.glob("*-filter.json")):
            pods.append(json.loads(f.read_text())["Pod"])
    if not pods:
        pods.append({"metadata": {"name": "p", "namespace": "default", "uid": "u-p", "annotations": {}},
                     "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    return pods


def _leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _leaves(v, path + (i,))
    return out


def _set(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


DEEP_MARK = "\u0001deep-"   # stands for a value nested too deep for json.dumps; expanded in the text


def _deep(depth: int) -> Any:
    if depth > 400:   # json.dumps itself recurses: the text is made by hand (_expand_deep)
        return f"{DEEP_MARK}{depth}"
    v: Any = "x"
    for _ in range(depth):
        v = {"a": v}
    return v


def _expand_deep(text: str) -> str:
    """Replace each deep marker by ``{"a":{"a":...}}`` nested that many levels (below orjson's
    limit of 1,024, so it reaches the extender's code rather than the decoder's refusal)."""
    quoted = json.dumps(DEEP_MARK)[:-1]          # the marker as json.dumps writes it, without its end quote
    while quoted in text:
        start = text.index(quoted)
        end = text.index('"', start + len(quoted))
        depth = int(text[start + len(quoted):end])
        text = text[:start] + '{"a":' * depth + '"x"' + "}" * depth + text[end + 1:]
    return text


def mutate_pod(rng: random.Random, pod: dict) -> Any:
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["uid"] = f"fuzz-{rng.getrandbits(40):x}"
    pod["metadata"]["name"] = rng.choice([f"fuzz-{rng.getrandbits(20)}", "x" * rng.choice([1, 63, 300]), "", "💥"])
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        leaves = _leaves(pod)
        if kind < 0.45:
            pod = _set(pod, rng.choice(leaves), hostile(rng))
        elif kind < 0.7:   # a hostile request or annotation
            spec = pod.get("spec") if isinstance(pod, dict) and isinstance(pod.get("spec"), dict) else None
            meta = pod.get("metadata") if isinstance(pod, dict) and isinstance(pod.get("metadata"), dict) else None
            key = rng.choice(KEYS)
            if key.startswith("stowage.io") and meta is not None:
                if not isinstance(meta.get("annotations"), dict):
                    meta["annotations"] = {}
                meta["annotations"][key] = hostile(rng, ["pack", "spread", "A10,A100", "80Gi", "any"])
            elif spec is not None:
                cs = spec.get("containers")
                if isinstance(cs, list) and cs and isinstance(cs[0], dict):
                    res = cs[0].setdefault("resources", {})
                    if isinstance(res, dict):
                        lim = res.setdefault("limits", {})
                        if isinstance(lim, dict):
                            lim[key] = hostile(rng, ["1", "2", "8", "20", "100"])
        elif kind < 0.85 and len(leaves) > 1:   # drop a key
            path = rng.choice(leaves[1:])
            parent = pod
            for p in path[:-1]:
                parent = parent[p]
            try:
                del parent[path[-1]]
            except (KeyError, IndexError, TypeError):
                pass
        else:
            pod = _set(pod, rng.choice(leaves), _deep(rng.choice([10, 100, 400, 1000])))
    return pod


def node_names(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.5:
        return rng.sample(NODES, rng.randint(1, len(NODES)))
    if r < 0.6:
        return [rng.choice(NODES)] * rng.randint(2, 50)
    if r < 0.7:
        return [f"ghost-{i}" for i in range(rng.choice([1, 100, 5000]))]
    if r < 0.8:
        return [hostile(rng) for _ in range(rng.randint(1, 20))]
    return hostile(rng)


def victims_map(rng: random.Random) -> Any:
    """NodeNameToMetaVictims: real and ghost nodes, UIDs real-looking, repeated or hostile."""
    if rng.random() < 0.1:
        return hostile(rng)
    out = {}
    for node in rng.sample(NODES + ["ghost"], rng.randint(0, 4)):
        uids = [{"UID": rng.choice([f"fuzz-{rng.getrandbits(12):x}", "", "x" * 300])}
                for _ in range(rng.choice([0, 1, 3, 50]))]
        out[node] = {"Pods": uids, "NumPDBViolations": rng.choice([0, 1, 5, -1, 2 ** 70, None, "3"])}
    return out


def body_for(rng: random.Random, verb: str, pods: list[dict]) -> bytes:
    r = rng.random()
    if r < 0.08:   # not JSON / not an object / truncated
        return rng.choice([b"", b"{", b"[]", b"42", b"null", b'"x"', bytes(rng.getrandbits(8) for _ in range(64)),
                           b'{"Pod":' * 200, b"\xff\xfe{}"])
    if verb == "bind":
        body: Any = {"PodName": rng.choice([f"fuzz-{rng.getrandbits(16)}", "", None, 7, "x" * 300]),
                     "PodNamespace": rng.choice(["default", "kube-system", "", None, "💥"]),
                     "PodUID": rng.choice([f"fuzz-{rng.getrandbits(40):x}", "", None, [], "a" * 1000]),
                     "Node": rng.choice(NODES + ["ghost", "", None, 1])}
        if rng.random() < 0.3:
            body = _set(body, rng.choice(_leaves(body)), hostile(rng))
    elif verb == "preempt":
        body = {"Pod": mutate_pod(rng, rng.choice(pods)), "NodeNameToMetaVictims": victims_map(rng)}
        if rng.random() < 0.2:  # the full form, or both
            body["NodeNameToVictims"] = {rng.choice(NODES): {"Pods": [copy.deepcopy(rng.choice(pods))],
                                                         "NumPDBViolations": 0}}
            if rng.random() < 0.5:
                del body["NodeNameToMetaVictims"]
        if rng.random() < 0.3:
            body = _set(body, rng.choice(_leaves(body)), hostile(rng))
    else:
        body = {"Pod": mutate_pod(rng, rng.choice(pods)), "Nodes": None, "NodeNames": node_names(rng)}
        if rng.random() < 0.1:
            body["Nodes"] = hostile(rng, [{"items": [{"metadata": {"name": rng.choice(NODES)}}]}])
    text = _expand_deep(json.dumps(body, ensure_ascii=rng.random() < 0.5))
    if rng.random() < 0.05:
        text = text[: rng.randint(0, len(text))]
    return text.encode("utf-8", "surrogatepass")


@dataclass
class FuzzResult:
    requests: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    five_xx: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    tracebacks: int = 0
    peak_rss_mib: float = 0.0
    start_rss_mib: float = 0.0
    overbooked: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return not self.five_xx and not self.tracebacks and not self.overbooked


def _rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (gunicorn master, workers, decision process)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
    return total


def overbooked(state: dict) -> list[str]:
    """Cards booked beyond what they hold, from /state: negative free memory or compute, a card
    held whole by one pod and used by any other."""
    bad = []
    for node in state["nodes"]:
        for card in node["cards"]:
            if card["freeMemoryMiB"] < 0 or card["freeCoreMilli"] < 0:
                bad.append(f"{node['name']} card {card['index']}: {card}")
    users: dict[tuple, list[tuple[str, bool]]] = {}
    for uid, a in state["allocations"].items():
        for k in a["cards"]:
            users.setdefault((a["node"], k), []).append((uid, a["whole"]))
    for key, us in users.items():
        if len(us) > 1 and any(whole for _, whole in us):
            bad.append(f"{key} held whole and shared: {us}")
    return bad


class Served:
    """``stowage extender --simulated builtin`` under gunicorn, as deployed, for one run: its
    address while open, and the tracebacks its log holds once closed."""

    def __init__(self, workers: int, log_dir: str) -> None:
        from extender_harness import start_process
        self.proc, self.session = start_process("builtin", log_dir, "--workers", str(workers))
        host, port = self.proc.url.split("//")[1].split(":")
        self.host, self.port = host, int(port)
        self.tracebacks = 0

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc: object) -> None:
        self.session.close()
        self.proc.stop()
        self.tracebacks = Path(self.proc.log.name).read_text(errors="replace").count("Traceback (most recent call last)")


def run(per_verb: int, workers: int = 1, seed: int = 1, log_dir: str = "/tmp", progress: bool = False) -> FuzzResult:
    import socket
    import http.client

    rng = random.Random(seed)
    pods = base_pods()
    res = FuzzResult()
    with Served(workers, log_dir) as served:
        proc, session, host, port = served.proc, served.session, served.host, served.port
        res.start_rss_mib = res.peak_rss_mib = _rss_mib(proc.proc.pid)
        for verb in ("filter", "prioritize", "bind", "preempt"):
            for n in range(per_verb):
                body = body_for(rng, verb, pods)
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                t0 = time.monotonic()
                try:
                    ctype = rng.choice(["application/json", "application/json", "text/plain", "application/x-www-form-urlencoded"])
                    conn.request("POST", "/" + verb, body=body, headers={"Content-Type": ctype})
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (socket.timeout, TimeoutError) as exc:
                    raise AssertionError(f"{verb} request {n} hung past 30 s: {body[:200]!r}") from exc
                finally:
                    conn.close()
                res.slowest_s = max(res.slowest_s, time.monotonic() - t0)
                res.requests[verb] = res.requests.get(verb, 0) + 1
                res.statuses[status] = res.statuses.get(status, 0) + 1
                if status >= 500:
                    res.five_xx.append(f"{verb} -> {status}: {body[:300]!r}")
                if n % 500 == 0:
                    res.peak_rss_mib = max(res.peak_rss_mib, _rss_mib(proc.proc.pid))
                    if progress:
                        print(f"{verb} {n}/{per_verb} statuses {res.statuses} rss {res.peak_rss_mib:.0f} MiB",
                              file=sys.stderr)
        res.peak_rss_mib = max(res.peak_rss_mib, _rss_mib(proc.proc.pid))
        res.overbooked = overbooked(session.get(proc.url + "/state", timeout=30).json())
    res.tracebacks = served.tracebacks
    return res


# -------------------------------------------------------------------------------- HTTP framing
# The requests above are well framed; these are not. Each starts as a good filter request and
# gets one to three mutations of its request line, headers, framing or line endings, as a broken
# client or a prober would send them. gunicorn's parser and the extender's read-ahead
# (extender/intake.py) see them first.

METHODS = ["GET", "PUT", "DELETE", "OPTIONS", "HEAD", "CONNECT", "", "P\x00ST", "POST POST", "post", "X" * 300]
PATHS = ["/filter%00", "/" + "a" * 9000, "//filter", "/filter?x=1&x=2", "*", "/filter/../bind", "/\xff\xfe",
         "http://evil/filter", "/filter#frag", "", "/filter\x1b[2J"]
VERSIONS = ["HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1x", "", "HTTP/1", "http/1.1"]
LENGTHS = ["", "-1", "+5", "5 5", "5\x1b[2J", "0x10", "1e3", "\u00b2", "9" * 5000, " 12 ", "1" * 25, "5, 5",
           "\u0663"]
ENCODINGS = ["chunked", "chunked, gzip", "gzip", "identity", "Chunked", "chunked\x00", "gzip, chunked", " chunked"]
JUNK_HEADERS = ["NoColon", "Bad Name: x", "X-Nul: a\x00b", "X-Long: " + "v" * 20000, " folded continuation",
                "X-Ctl: \x1b[2J", ": empty-name", "X-Latin: \xe9\xff", "Host: second-host",
                "Expect: 100-continue", "Connection: upgrade", "Upgrade: h2c", "X-Forwarded-For: 1.2.3.4"]


def framing_request(rng: random.Random, body: bytes) -> tuple[bytes, bool, bool]:
    """(raw request, whether to close our side after sending, whether its head ends). Our side
    is closed where the server has a reason to wait for more (a body shorter than a length it
    states, a head that never ends): waiting out the client timeout proves nothing here. Where
    everything was sent, the server must answer without waiting: a 408 there is a failure."""
    method, path, version = "POST", "/filter", "HTTP/1.1"
    headers = [("Host", "x"), ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    eol, half_close = "\r\n", False
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(8)
        if kind == 0:
            method = rng.choice(METHODS)
        elif kind == 1:
            path = rng.choice(PATHS)
        elif kind == 2:
            version = rng.choice(VERSIONS)
        elif kind == 3:   # a Content-Length that is no number, or a second one
            value = rng.choice(LENGTHS + [str(len(body) + 1), str(len(body) - 1), str(len(body))])
            if rng.random() < 0.3:
                headers.append(("Content-Length", value))
            else:
                headers = [(k, value if k == "Content-Length" else v) for k, v in headers]
            # all is sent: only a length that is a number past the body leaves the server waiting
            half_close = half_close or value == str(len(body) + 1)
        elif kind == 4:   # chunked, well formed or not, with or without a Content-Length beside it
            te = rng.choice(ENCODINGS)
            if rng.random() < 0.7:
                headers = [h for h in headers if h[0] != "Content-Length"]
            headers.append(("Transfer-Encoding", te))
            if rng.random() < 0.7:
                body = (f"{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
            half_close = True
        elif kind == 5:
            headers.append((rng.choice(JUNK_HEADERS), None))  # type: ignore[arg-type]
        elif kind == 6:
            eol = rng.choice(["\n", "\r", "\r\r\n", "\n\r"])
            half_close = True
        else:   # many headers
            headers += [(f"X-H{i}", "v") for i in range(rng.choice([50, 101, 500]))]
    lines = [f"{method} {path} {version}".rstrip(" ")] + [k if v is None else f"{k}: {v}" for k, v in headers]
    head = eol.join(lines) + eol + eol
    return head.encode("utf-8", "surrogateescape") + body, half_close, "\n" in eol


@dataclass
class FramingResult:
    sent: int = 0
    statuses: dict[str, int] = field(default_factory=dict)   # "400", ..., "closed" (no answer)
    five_xx: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    waited: list[str] = field(default_factory=list)   # a 408 to a request sent whole
    unanswered: list[str] = field(default_factory=list)   # closed without an answer, the head whole
    tracebacks: int = 0
    good_after: int = 0   # the status of a good filter request after all of them

    def failures(self) -> list[str]:
        return ([f"5xx {x}" for x in self.five_xx] + [f"hung {x}" for x in self.hung]
                + [f"408 to a request sent whole {x}" for x in self.waited]
                + [f"no answer {x}" for x in self.unanswered])

    def ok(self) -> bool:
        return not self.failures() and not self.tracebacks and self.good_after == 200


def run_framing(count: int, workers: int = 1, seed: int = 1, log_dir: str = "/tmp", limit_s: float = 30.0,
                progress: bool = False) -> FramingResult:
    """``count`` badly framed requests over raw sockets; a request hangs when neither an answer
    nor the connection's end comes within ``limit_s`` (the server's own client timeout is 10 s)."""
    import socket

    rng = random.Random(seed)
    pods = base_pods()
    res = FramingResult()
    with Served(workers, log_dir) as served:
        for n in range(count):
            body = json.dumps({"Pod": rng.choice(pods), "NodeNames": NODES}).encode()
            raw, half_close, head_ends = framing_request(rng, body)
            with socket.create_connection((served.host, served.port), timeout=limit_s) as s:
                try:
                    s.sendall(raw)
                    if half_close:
                        s.shutdown(socket.SHUT_WR)
                    answer = b""
                    while len(answer) < 64 and (chunk := s.recv(4096)):
                        answer += chunk
                except socket.timeout:
                    res.hung.append(repr(raw[:200]))
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    answer = b""
            res.sent += 1
            status = answer.split(b" ", 2)[1].decode("latin-1") if answer.startswith(b"HTTP/") else "closed"
            res.statuses[status] = res.statuses.get(status, 0) + 1
            if status.startswith("5"):
                res.five_xx.append(f"{status}: {raw[:300]!r}")
            elif status == "408" and not half_close:
                res.waited.append(repr(raw[:300]))
            elif status == "closed" and head_ends:
                res.unanswered.append(repr(raw[:300]))
            if progress and n % 200 == 0:
                print(f"framing {n}/{count} statuses {res.statuses}", file=sys.stderr)
        res.good_after = served.session.post(served.proc.url + "/filter", json={"Pod": pods[0], "NodeNames": NODES},
                                             timeout=30).status_code
    res.tracebacks = served.tracebacks
    return res


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python tests/fuzzing.py``, apart from ``main`` so that
    tests/test_doc_commands.py can check the documented command lines against it without running them."""
    from benchmarks.cliargs import whole_number   # a run of 0 requests or 0 workers would pass testing nothing
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-verb", type=whole_number(1, 100_000_000), default=10_000, help="requests per verb (filter, prioritize, bind, preempt)")
    ap.add_argument("--workers", type=whole_number(1, 64), default=1, help="1: one process; 2+: the split layout")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--framing", type=whole_number(0, 100_000_000), default=0,
                    help="then this many badly framed HTTP requests (request line, headers, Content-Length, "
                         "chunking, line endings) over raw sockets")
    return ap


def main() -> int:
    a = build_parser().parse_args()
    res = run(a.per_verb, a.workers, a.seed, progress=True)
    print(json.dumps({"requests": res.requests, "statuses": res.statuses, "5xx": len(res.five_xx),
                      "tracebacks": res.tracebacks, "slowest_s": round(res.slowest_s, 3),
                      "rss_mib_start": round(res.start_rss_mib), "rss_mib_peak": round(res.peak_rss_mib),
                      "overbooked_cards": res.overbooked}, indent=1))
    for line in res.five_xx[:10]:
        print("5xx:", line)
    ok = res.ok()
    if a.framing:
        fr = run_framing(a.framing, a.workers, a.seed, progress=True)
        print(json.dumps({"framing": {"sent": fr.sent, "statuses": fr.statuses, "failures": len(fr.failures()),
                                      "tracebacks": fr.tracebacks, "good_request_after": fr.good_after}}, indent=1))
        for line in fr.failures()[:10]:
            print("framing:", line)
        ok = ok and fr.ok()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
