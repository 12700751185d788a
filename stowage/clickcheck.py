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

from typing import Any, Callable

import click

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
