"""Plain-text tables for the operator commands (`inspect`, `plan`): aligned columns, numbers
right-aligned, no dependency — output that reads well in a terminal and diffs well in a ticket."""
from __future__ import annotations

import re
import unicodedata
from typing import Any, Sequence


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


MAX_ALIGNED = 60   # characters: a longer cell overflows its own line instead of widening its column


# Unicode categories that must not reach a terminal or a log line as they are: control characters
# (escape sequences, carriage returns, new lines), format characters (a right-to-left override
# shows the rest of its line reversed; zero-width ones hide text), lone surrogates (not encodable:
# writing one to a UTF-8 terminal raises), line and paragraph separators.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


# The longest run without white space an API server's names make: a pod's key, namespace (a DNS
# label, 63) "/" name (a DNS subdomain, 253). A longer run came from a hostile or fake source, not
# from an API server: a 5,000-character node name was printed whole, lines of 10,000 characters
# in `stowage plan`.
MAX_NAME_SHOWN = 63 + 1 + 253
_LONG_RUN = re.compile(r"\S{%d,}" % (MAX_NAME_SHOWN + 1))


def _cut(run: re.Match[str]) -> str:
    """The run's first characters and '...' (no longer than :data:`MAX_NAME_SHOWN`, so that text
    printed twice is cut once), then how long it was."""
    return f"{run.group()[:MAX_NAME_SHOWN - 3]}... ({len(run.group())} characters)"


def printable(text: str) -> str:
    """The cell or line as the terminal should get it: the characters of :data:`UNSAFE_CATEGORIES`
    a node's owner or a pod author may have written shown as '?', and every run without white
    space longer than :data:`MAX_NAME_SHOWN` (no name an API server takes is) cut there, saying
    how long it was."""
    safe = "".join("?" if unicodedata.category(ch) in UNSAFE_CATEGORIES else ch for ch in text)
    return _LONG_RUN.sub(_cut, safe) if len(safe) > MAX_NAME_SHOWN else safe


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "") -> str:
    """The table as one string; ``None`` cells print as '-'. A cell over :data:`MAX_ALIGNED`
    characters does not set its column's width (one 100 KB model name padded every row to it)."""
    cells = [[("-" if v is None else printable(str(v))) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for j, c in enumerate(row):
            if len(c) <= MAX_ALIGNED:
                widths[j] = max(widths[j], len(c))
    numeric = [all(_is_num(r[j]) for r in rows if r[j] is not None) and any(r[j] is not None for r in rows)
               for j in range(len(headers))]

    def line(vals: Sequence[str]) -> str:
        out = [v.rjust(widths[j]) if numeric[j] else v.ljust(widths[j]) for j, v in enumerate(vals)]
        return (indent + "  ".join(out)).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in cells])
