"""The two command-line options that decide which allocation records count, for every command
that reads records: the extender, the device plugin, ``stowage inspect`` and ``stowage plan``.

The extender and the device plugin must honour the same records (a record one honours and the
other refuses is a pod placed on a card it is then refused, or the other way round), and the
operator commands must see what the extender sees. So the options are declared once, here: the
same names, the same environment variables (:data:`~stowage.allocation.RECORD_KEY_ENV`,
:data:`~stowage.allocation.SCHEDULER_NAMES_ENV`), the same default schedulerName, the same
trust (:meth:`~stowage.allocation.RecordTrust.from_options`) and the same one-line error for a
key file that cannot be used. Each command words its own help around them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from .allocation import (DEFAULT_SCHEDULER_NAMES, RECORD_KEY_ENV, SCHEDULER_NAMES_ENV, AllocationError,
                         RecordTrust)

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def record_key_file_option(help: str) -> Decorator:
    """``--record-key-file FILE`` (env STOWAGE_RECORD_KEY_FILE) into the parameter ``record_key_file``."""
    return click.option("--record-key-file", envvar=RECORD_KEY_ENV, show_envvar=True,
                        type=click.Path(dir_okay=False), default=None, help=help)


def scheduler_name_option(help: str) -> Decorator:
    """``--scheduler-name NAME``, repeatable (env STOWAGE_SCHEDULER_NAMES, space separated), default
    ``stowage-scheduler``, into the parameter ``scheduler_names``."""
    return click.option("--scheduler-name", "scheduler_names", envvar=SCHEDULER_NAMES_ENV, show_envvar=True,
                        multiple=True, default=DEFAULT_SCHEDULER_NAMES, show_default=True,
                        help=help + " Repeat for several profiles (env: space separated).")


def load_trust(record_key_file: str | Path | None, memory_unit_mib: int,
               scheduler_names: tuple[str, ...] | frozenset[str]) -> RecordTrust:
    """:meth:`RecordTrust.from_options`, with a key file that cannot be used (unreadable, too
    short) refused as a bad ``--record-key-file`` (exit 2, one line), as every command refuses it."""
    try:
        return RecordTrust.from_options(record_key_file, memory_unit_mib, scheduler_names)
    except AllocationError as exc:
        raise click.BadParameter(str(exc), param_hint="--record-key-file") from None
