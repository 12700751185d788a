"""Checks of a click command line that need several options at once, made while parsing.

click checks one option at a time (types, ranges, callbacks). A rule about several (``--fill``
only with ``--simulated``; TLS flags all or none) written in the command's body runs only when
the command is invoked, so anything that parses a command line without running it (the docs'
check of every quoted command, shell completion, a wrapper) takes a line the command refuses.
:func:`after_parsing` registers such a rule on the command's callback, and :class:`CheckedCommand`
runs the rules as part of parsing (``make_context``): every command of ours that has such rules
(the extender, ``stowage inspect``, ``stowage plan``) uses it, so the rules are one mechanism
on the ground floor, not one per command.
"""
from __future__ import annotations

import errno
import socket
from typing import Any, Callable

import click

from .digits import whole_number

ParamCheck = Callable[[click.Context], None]
_CHECKS = "__stowage_param_checks__"   # on a command's callback: its ParamChecks, in order


def after_parsing(check: ParamCheck) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``check(ctx)`` runs once click has parsed the command line (``ctx.params``), in
    :class:`CheckedCommand`, and raises a :class:`click.UsageError` for a command line the
    command cannot run. Checks registered by decorators further out run first."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _CHECKS, (check, *getattr(fn, _CHECKS, ())))
        return fn
    return register


def checked_while_parsing(ctx: click.Context) -> bool:
    """Whether ``ctx``'s command line went through :class:`CheckedCommand`'s checks: a callback
    with rules asks this and refuses to run unchecked (on a plain ``click.Command``)."""
    return bool(ctx.meta.get(_CHECKS))


class CheckedCommand(click.Command):
    """A click command that runs its callback's :func:`after_parsing` checks as part of parsing,
    so a refused combination of options is refused wherever the command line is parsed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        if not ctx.resilient_parsing:   # shell completion parses half-typed lines
            for check in getattr(self.callback, _CHECKS, ()):
                check(ctx)
        ctx.meta[_CHECKS] = True
        return rest


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:9888`` for IPv6) -> (host, port); ValueError with a clear message."""
    host, sep, port = value.rpartition(":")
    number = whole_number(port, 65536) if sep else None
    if number is None or not 0 < number < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. 0.0.0.0:9888), got {value!r}")
    return host.strip("[]") or "0.0.0.0", number


def check_can_listen(address: str, flag: str, hint: str = "") -> None:
    """Refuse, with one line naming ``flag``, a ``HOST:PORT`` this process cannot listen on
    (``hint``: what else may hold it, said before "choose a free port").

    Why before the listener: for the extender's --bind in use gunicorn retries for 5 seconds and
    prints ten error lines; for --metrics-bind the worker fails with a traceback and gunicorn
    exits 3 ("Worker failed to boot"); the device plugin served and registered with the kubelet,
    then died on its --metrics-port with a traceback. The socket is closed at once (SO_REUSEADDR,
    as gunicorn and the metrics server bind), so the real listener still binds it; a port taken
    in between is still the listener's to report."""
    host, port = parse_host_port(address)
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                            flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(where)
    except OSError as exc:   # socket.gaierror is one
        raise cannot_listen(address, flag, exc, hint) from None


def cannot_listen(address: str, flag: str, exc: OSError, hint: str = "") -> click.ClickException:
    """The one line that says ``address`` (given by ``flag``) cannot be listened on, and why: by
    :func:`check_can_listen`, and by a listener that lost the port in between."""
    said = f" ({hint}choose a free port with {flag})" if exc.errno == errno.EADDRINUSE else ""
    return click.ClickException(f"cannot listen on {address} ({flag}): {exc.strerror or exc}{said}")
