"""The `stowage` command. Each subcommand lives in the module of the component it runs and is
imported only when used, so `stowage --help` is fast and a missing optional dependency of one
component (e.g. no NVML library) never breaks the others."""
from __future__ import annotations

import importlib

import click

# name -> (module:attribute of a click.Command, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "extender": ("extender.cli:serve", "Run the kube-scheduler extender (gunicorn) against a cluster or the simulated one."),
    "demo": ("extender.demo:demo", "Start the extender on the embedded cluster and drive it like kube-scheduler does."),
    "device-plugin": ("deviceplugin.cli:main", "Run the kubelet device plugin on this node."),
    "exporter": ("exporter.cli:main", "Serve per-card, per-pod GPU metrics for Prometheus."),
    "inspect": ("stowage_ops.inspect_cmd:inspect", "Show per-node, per-card allocation, free memory and health."),
    "plan": ("stowage_ops.plan_cmd:plan", "What-if: how many more pods of a shape fit, which nodes could be emptied."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        target, short = SUBCOMMANDS[name]
        module, attr = target.split(":")
        try:
            cmd = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            why = str(exc)   # ``exc`` is unbound once the except block ends; the command runs later

            @click.command(name=name, help=short)
            def unavailable() -> None:
                raise click.ClickException(f"'stowage {name}' is unavailable in this installation: {why}")
            return unavailable
        if not cmd.short_help:
            cmd.short_help = short
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stowage")
def main() -> None:
    """Stowage packs GPU pods onto as few cards and nodes as possible.

    Start with `stowage demo` (no cluster needed), then see each subcommand's --help.
    """


if __name__ == "__main__":
    main()
