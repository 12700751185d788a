"""``stowage inspect``/``plan``: what the operator types is refused while it is parsed, in one
line (exit 2), never a traceback or a what-if of a shape no pod could have."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from stowage.cli import main
from stowage.resources import MAX_CARD_MEMORY_MIB, MAX_GPUS_PER_POD
from stowage_ops.cluster_source import cluster_options
from stowage_ops.planning import ShapeError, parse_shape


@pytest.mark.parametrize("shape, said", [
    ("9" * 5000, "at most 64"),                  # int() of >4300 digits raises ValueError, not ShapeError
    ("9" * 50, "at most 64"),
    (f"{MAX_GPUS_PER_POD + 1}", "at most 64"),
    ("9" * 5000 + "x80Gi", "at most 64"),
    ("1x" + "9" * 5000 + "Gi", "not a memory quantity"),
    ("1x1Pi", "any card"),
    ("1Ei,50%", "any card"),
])
def test_a_shape_no_pod_could_have_is_a_shape_error(shape, said):
    with pytest.raises(ShapeError, match=said):
        parse_shape(shape)
    r = CliRunner().invoke(main, ["plan", "--simulated", "--shape", shape])
    assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["inspect", "--simulated", "--typical", shape])
    assert r.exit_code == 2 and said in r.output


def test_the_largest_shapes_a_pod_can_have_are_taken():
    assert parse_shape(f"{MAX_GPUS_PER_POD}").req.gpus == MAX_GPUS_PER_POD
    assert parse_shape(f"1x{MAX_CARD_MEMORY_MIB}Mi").req.min_card_mem_mib == MAX_CARD_MEMORY_MIB
    assert parse_shape(f"{MAX_CARD_MEMORY_MIB}Mi,100%").req.mem_mib == MAX_CARD_MEMORY_MIB


def test_cluster_options_refuse_to_run_unchecked():
    """Their checks run while parsing (OperatorCommand): on a plain click command they would never
    run, so the command refuses to start rather than take e.g. --fill on a live cluster."""
    @click.command()
    @cluster_options
    def bare(source) -> None:
        click.echo("ran")

    r = CliRunner().invoke(bare, ["--simulated"])
    assert isinstance(r.exception, RuntimeError) and "OperatorCommand" in str(r.exception)


@pytest.mark.parametrize("args, said", [
    # inspect reads the ConfigMap only with --learned: without it the option changed nothing.
    (["inspect", "--kubeconfig", "/nonexistent", "--learned-configmap", "ns/name"],
     "--learned-configmap only applies with --learned"),
    # --limit stops counting a --shape; --drain and --preempt count nothing.
    (["plan", "--simulated", "--drain", "--limit", "5"], "--limit only applies to --shape"),
    # --top lists the nodes of a --shape or --preempt answer; --drain lists every node it empties.
    (["plan", "--simulated", "--drain", "--top", "2"], "--top only applies to --shape and --preempt"),
])
def test_an_option_that_would_change_nothing_is_refused(args, said):
    """Found by trying them: each was taken and silently ignored, so the operator believed the
    answer honoured it (a --learned-configmap naming the extender's ConfigMap; a --top 2 that
    listed every drained node)."""
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and said in r.output, r.output


def test_the_options_are_taken_where_they_apply():
    for args in (["plan", "--simulated", "--shape", "1", "--limit", "3", "--top", "1"],
                 ["plan", "--simulated", "--preempt", "1", "--priority", "1", "--top", "1"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output


def test_plan_help_names_its_three_questions_as_they_are_answered():
    """plan --help's summary said --drain moves "the fewest GPU pods" (it moves CPU-only pods too,
    docs/operator-tools.md) and did not name --preempt at all."""
    r = CliRunner().invoke(main, ["plan", "--help"])
    summary = " ".join(r.output.split("Pods are placed")[0].split("[OPTIONS]")[1].split())
    assert "--preempt" in summary and "--drain" in summary and "SHAPE" in summary
    assert "GPU pods" not in summary
