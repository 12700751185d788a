"""Text a pod author wrote (an annotation's value, above all the allocation record's) reaches
people: the device plugin's refusals (its log, and the gRPC status the kubelet puts in the pod's
admission error), the components' log lines, the operator's terminal. None of it may carry a
control character there: a raw new line forges a log line, an escape sequence rewrites the
operator's screen or window title, a bidi override reorders what a table row shows (audit,
2026-12-05; each test failed before its fix)."""
from __future__ import annotations

import logging
import unicodedata

import pytest

from dp_harness import bind_pod, container, record, rig
from fakekubelet import AdmissionError

# A colour, a cleared screen, a window title (OSC ... BEL), a carriage return and a new line that
# starts a forged log line, a right-to-left override, a line separator.
HOSTILE = "GPU-x\x1b[31m\x1b[2J\x1b]0;owned\x07\r\n2026-12-05 ERROR forged\u202eevil\u2028more"
UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def raw(text: str) -> list[str]:
    """The characters of ``text`` that must not reach a log line or a terminal as they are."""
    return [ch for ch in text if unicodedata.category(ch) in UNSAFE]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_record_naming_a_hostile_card_is_refused_without_its_control_characters(monkeypatch):
    """The record's card uuid (any text of up to 256 characters in a cluster that does not sign
    records) was quoted as it was into the refusal: the plugin's log line and the gRPC status
    the kubelet shows as the pod's admission error. It came out as
    ``its record names card GPU-x\\x1b[31m...\\r\\n2026-12-05 ERROR forged...`` with the escape
    sequences and the new line raw."""
    lines = Lines()
    logging.getLogger("stowage").addHandler(lines)
    try:
        with rig(monkeypatch) as r:
            assert r.registered()
            pod = bind_pod(r, "ghost", [container("main", gpus=1)],
                           record([(3, HOSTILE + "y" * 150)], whole=True, mem_mib=81920, core_milli=1000),
                           "2024-01-01T00:00:01Z")
            with pytest.raises(AdmissionError) as exc:
                r.kubelet.admit(pod)
    finally:
        logging.getLogger("stowage").removeHandler(lines)
    details = str(exc.value)
    assert "default/ghost: its record names card 'GPU-x\\x1b[31m" in details
    assert "which is not among the cards this plugin advertises" in details
    assert not raw(details) and "y" * 100 not in details   # quoted short
    refusals = [m for m in lines.messages if "its record names card" in m]
    assert refusals and not any(raw(m) for m in refusals)


def test_the_operators_tables_show_no_bidi_override_nor_a_lone_surrogate():
    """`stowage inspect` / `plan` print what pod authors wrote (a learned shape's model list from
    ``stowage.io/gpu-model``). Only control characters were made printable: a right-to-left
    override (U+202E) reached the terminal and showed the rest of its row reversed, a line
    separator (U+2028) passed, and a lone surrogate (JSON's ``"\\ud800"``, which the fake API
    server serves as it was given) cannot be written to a UTF-8 terminal at all."""
    from stowage.textable import render
    out = render(["SHAPE", "PODS"], [["1 GPU on A100" + HOSTILE + "\ud800", 3], ["other", 1]])
    lines = out.split("\n")
    assert len(lines) == 3 and not any(raw(line) for line in lines) and "A100" in lines[1]
    out.encode("utf-8")   # what a terminal (or a pipe) takes


def test_say_writes_a_lone_surrogate_as_a_printable_character(monkeypatch):
    """``say`` (every line of `inspect` and `plan`) raised UnicodeEncodeError on a lone surrogate:
    a traceback instead of the command's output."""
    import io
    import sys
    from stowage_ops.cluster_source import say
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8", errors="strict"))
    say("pod ml/p: model A100\ud800 " + HOSTILE.replace("\r\n", " ") + "\nnext line")
    sys.stdout.flush()
    printed = out.getvalue().decode("utf-8").split("\n")
    assert printed[1:] == ["next line", ""] and not raw(printed[0]) and "A100" in printed[0]


def _formatted(logger_name: str, fmt_args: tuple) -> str:
    """One record as the components' stderr handler writes it."""
    from stowage.logtext import log_handler
    record = logging.getLogger(logger_name).makeRecord(logger_name, logging.WARNING, __file__, 1, fmt_args[0],
                                                       fmt_args[1:], None)
    return log_handler().format(record)


def test_a_log_line_never_carries_a_new_line_or_an_escape_sequence_of_what_it_quotes():
    """A name a caller of the extender's port sent (``bind`` of ``PodName`` "x\\r\\n2026-12-05
    ERROR forged"), or any other text a message quotes as it is, wrote a second, forged line
    into the component's log and escape sequences to whoever tails it. The components' handler
    writes each message on one line, its control characters escaped as repr() would."""
    line = _formatted("stowage.extender", ("bind %s -> %s refused: %s", "ns/" + HOSTILE, "n0", "no"))
    assert "\n" not in line and not raw(line)
    assert "bind ns/GPU-x\\x1b[31m\\x1b[2J\\x1b]0;owned\\x07\\r\\n2026-12-05 ERROR forged\\u202eevil\\u2028more" \
           " -> n0 refused: no" in line
    assert _formatted("stowage.x", ("%s", "a\ud800b")).endswith("a\\ud800b")
    assert _formatted("stowage.x", ("plain: %s", "GPU-1 ünïcode")).endswith("plain: GPU-1 ünïcode")   # unchanged


def test_a_traceback_keeps_its_lines():
    from stowage.logtext import log_handler
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record = logging.getLogger("stowage.x").makeRecord("stowage.x", logging.ERROR, __file__, 1, "failed: %s",
                                                           ("x\ny",), sys.exc_info())
    text = log_handler().format(record)
    first, *rest = text.split("\n")
    assert first.endswith("failed: x\\ny") and rest[0] == "Traceback (most recent call last):" and "ValueError: boom" in text


def test_a_tracebacks_exception_messages_are_escaped_and_its_lines_kept():
    """An exception's message may quote what a pod author or a peer wrote (a ValueError of an
    annotation's value, an API server's message), and ``log.exception`` wrote it as it was after
    the stack: its new line forged a log line, its escape sequences reached the terminal. The
    messages of the exception and of those chained to it (and their notes) are now escaped; the
    stack's own lines are kept."""
    import sys

    from stowage.logtext import log_handler
    try:
        try:
            raise KeyError("inner\r\n2026-12-05 ERROR forged-inner\x1b[2J")
        except KeyError as inner:
            err = ValueError("outer\n2026-12-05 ERROR forged-outer\u202e")
            err.add_note("note\n2026-12-05 ERROR forged-note")
            raise err from inner
    except ValueError:
        record = logging.getLogger("stowage.x").makeRecord("stowage.x", logging.ERROR, __file__, 1, "failed", (),
                                                           sys.exc_info())
    text = log_handler().format(record)
    lines = text.split("\n")
    assert not [ln for ln in lines if ln.startswith("2026-12-05 ERROR forged")]
    assert not [ln for ln in lines if raw(ln)]
    assert "ValueError: outer\\n2026-12-05 ERROR forged-outer\\u202e" in lines
    assert "note\\n2026-12-05 ERROR forged-note" in lines
    assert any(ln.startswith("KeyError: ") and "forged-inner\\x1b[2J" in ln for ln in lines)
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines.count("Traceback (most recent call last):") == 2


class _Configured(Exception):
    """Stops a component's command right after it configured its log."""


@pytest.mark.parametrize("module,args", [("extender.cli", ["--simulated", "builtin", "--bind", "unix:{tmp}/extender.sock"]),
                                         ("deviceplugin.cli", ["--no-kube"]),
                                         ("exporter.cli", ["--port", "0"])])
def test_each_component_logs_through_the_escaping_handler(module, args, monkeypatch, tmp_path):
    """The three components configured Python's plain handler (``logging.basicConfig``) with a
    format of their own; each now installs :func:`stowage.logtext.log_to_stderr`'s."""
    import importlib
    from click.testing import CliRunner
    import stowage.logtext

    def configured(level: str) -> None:
        raise _Configured(level)
    monkeypatch.setattr(stowage.logtext, "log_to_stderr", configured)
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: pytest.fail(f"{module} configured logging itself"))
    command = getattr(importlib.import_module(module), "serve" if module == "extender.cli" else "main")
    result = CliRunner().invoke(command, [a.format(tmp=tmp_path) for a in args])
    assert isinstance(result.exception, _Configured), result.output


def test_an_api_servers_message_reaches_a_bind_error_without_control_characters_and_bounded():
    """A bind error carries the API server's Status message, and kube-scheduler puts the error in
    the pod's FailedScheduling event. An admission webhook's denial may quote what the pod's
    author wrote, control characters and all, at any length."""
    import json

    from kubernetes.client.exceptions import ApiException

    from extender.kube import api_message

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "code": 403,
                           "message": "admission webhook denied: " + HOSTILE * 2000}).encode()
    said = api_message(exc)
    assert said.startswith("admission webhook denied: GPU-x") and said.endswith("(HTTP 403)")
    assert not raw(said), raw(said)[:5]
    assert len(said) < 2000
