"""A whole number written in plain ASCII digits, read without trusting its length.

Several peers and authors hand us numbers as text: a ``Retry-After`` or ``Content-Length`` header,
a GPU Feature Discovery label, a port on the command line, a device unit the kubelet echoes back.
Two traps sit in ``str.isdigit()`` + ``int()``, and both were a traceback somewhere:

- ``"²".isdigit()`` and ``"٣".isdigit()`` are true, and ``int("²")`` raises (``int("٣")`` reads 3);
- ``int()`` refuses a string of more than 4,300 digits with a ValueError (CPython's guard against
  quadratic conversion), so ``"9" * 5000`` raised where a "too large" answer was due.

:func:`whole_number` answers both once: None for anything but ASCII digits, and the value clamped
to ``cap`` (a number of more digits than ``cap`` has is never converted).
"""

from __future__ import annotations


def whole_number(text: str, cap: int) -> int | None:
    """``text`` as a whole number when it is one or more ASCII digits, else None; a value above
    ``cap`` (however many digits it has) reads as ``cap``, so ``> limit`` checks with
    ``cap = limit + 1`` see "too large" without converting a huge string.

    Leading zeros are read as a number reads them (``"007"`` is 7); a caller that must refuse
    other spellings checks the text itself.
    """
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(cap)):
        return cap
    return min(int(digits), cap)
