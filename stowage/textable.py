"""Plain-text tables for the operator commands (`inspect`, `plan`): aligned columns, numbers
right-aligned, no dependency — output that reads well in a terminal and diffs well in a ticket."""
from __future__ import annotations

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


def printable(text: str) -> str:
    """The cell as the terminal should get it: the characters of :data:`UNSAFE_CATEGORIES` a node's
    owner or a pod author may have written shown as '?'."""
    return "".join("?" if unicodedata.category(ch) in UNSAFE_CATEGORIES else ch for ch in text)


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
