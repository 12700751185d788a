"""The components' log lines (extender, device plugin, exporter): one line per message, whatever
the message quotes.

Messages quote text others wrote: names a caller of the extender's port sent, the API server's
and the kubelet's messages, and (mostly through ``repr`` or :func:`stowage.resources.shown`, but
not only) what pod authors wrote. One raw new line in such a text forges a log line that a reader
or a log pipeline takes for the component's own; an escape sequence rewrites the terminal of
whoever tails the log. So the handler escapes, in the message only, the characters of
:data:`~stowage.textable.UNSAFE_CATEGORIES` as ``repr`` writes them (``\\n``, ``\\x1b``,
``\\u202e``); a traceback logged with it keeps its lines, and the messages of its exceptions
(which may quote the same texts) are escaped as the message is. Backslashes are not doubled, so that
messages already quoting with ``repr`` read as before: ``\\x1b`` in a line may also have been
written as those four characters.
"""
from __future__ import annotations

import logging
import traceback
import unicodedata
from types import TracebackType

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


class _EscapedTraceback(traceback.TracebackException):
    """A traceback whose exception lines (``Type: message``, each note) are written through
    :func:`escaped`; the stack's lines (our own files and source) are kept as they are.

    Each chunk :meth:`format_exception_only` yields is one line of the traceback, its text and
    then its new line; any other new line in it came from the message. (Notes are split into
    lines by the library itself, so :func:`_escaping_chain` escapes them before.)"""

    def format_exception_only(self, **kwargs: object):  # type: ignore[override]
        for chunk in super().format_exception_only(**kwargs):  # type: ignore[arg-type]
            body, end = (chunk[:-1], "\n") if chunk.endswith("\n") else (chunk, "")
            yield escaped(body) + end


def _escaping_chain(te: traceback.TracebackException) -> traceback.TracebackException:
    """Make every exception of ``te``'s chain (its causes, contexts and a group's members, which
    the standard library builds as plain ``TracebackException``) escape its lines too."""
    seen: set[int] = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t.__class__ = _EscapedTraceback
        notes = getattr(t, "__notes__", None)
        if isinstance(notes, (list, tuple)):   # the library splits each note into lines: escape first
            t.__notes__ = [escaped(n) if isinstance(n, str) else n for n in notes]
        todo.extend([t.__cause__, t.__context__, *(getattr(t, "exceptions", None) or ())])  # type: ignore[list-item]
    return te


class EscapingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` that writes the message through :func:`escaped`; the
    traceback and stack it appends after the message keep their lines, with the messages of the
    traceback's exceptions escaped too."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: tuple[type[BaseException], BaseException, TracebackType | None]
                        | tuple[None, None, None]) -> str:  # type: ignore[override]
        if ei[0] is None:
            return super().formatException(ei)
        te = _escaping_chain(traceback.TracebackException(ei[0], ei[1], ei[2]))  # type: ignore[arg-type]
        return "".join(te.format()).rstrip("\n")


def log_handler() -> logging.Handler:
    """A stderr handler with :data:`LOG_FORMAT`, escaping its messages."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    return handler


def log_to_stderr(level: str) -> None:
    """Configure the process's root logger as each component runs: ``level`` and one
    :func:`log_handler`. Gunicorn's workers inherit it from the extender's master process."""
    logging.basicConfig(level=level.upper(), handlers=[log_handler()])
