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
