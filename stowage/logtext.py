"""The components' log lines (extender, device plugin, exporter): one line per message, whatever
the message quotes.

Messages quote text others wrote: names a caller of the extender's port sent, the API server's
and the kubelet's messages, and (mostly through ``repr`` or :func:`stowage.resources.shown`, but
not only) what pod authors wrote. One raw new line in such a text forges a log line that a reader
or a log pipeline takes for the component's own; an escape sequence rewrites the terminal of
whoever tails the log. So the handler escapes, in the message only, the characters of
:data:`~stowage.textable.UNSAFE_CATEGORIES` as ``repr`` writes them (``\\n``, ``\\x1b``,
``\\u202e``); a traceback logged with it keeps its lines. Backslashes are not doubled, so that
messages already quoting with ``repr`` read as before: ``\\x1b`` in a line may also have been
written as those four characters.
"""
from __future__ import annotations

import logging
import unicodedata

from .textable import UNSAFE_CATEGORIES

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(text: str) -> str:
    """``text`` on one line: each character of an unsafe category as ``repr`` escapes it."""
    if text.isprintable():   # the common case, at C speed (a space is printable; no category above is)
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in UNSAFE_CATEGORIES else ch for ch in text)


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class EscapingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` that writes the message through :func:`escaped`; the
    traceback and stack it appends after the message keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)
        return super().formatMessage(record)


def log_handler() -> logging.Handler:
    """A stderr handler with :data:`LOG_FORMAT`, escaping its messages."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    return handler


def log_to_stderr(level: str) -> None:
    """Configure the process's root logger as each component runs: ``level`` and one
    :func:`log_handler`. Gunicorn's workers inherit it from the extender's master process."""
    logging.basicConfig(level=level.upper(), handlers=[log_handler()])
