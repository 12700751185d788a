"""`stowage plan --drain --max-nodes N` says how many candidates it never tried.

Found by review (session 14): the plan stops at N emptied nodes, and its closing lines named only
the nodes that stay (with a reason each), so the nodes it never tried read as if there were none
left to try ("2 of 36 GPU node(s) can be emptied", and nothing about the other 34)."""
from __future__ import annotations

import json

from click.testing import CliRunner
from planning_clusters import uniform_cluster

from stowage.cli import main
from stowage_ops.plan_cmd import _drain_text
from stowage_ops.planning import drain_plan


def test_the_plan_counts_the_candidates_it_never_tried():
    plan = drain_plan(uniform_cluster({"e1": 0, "e2": 0, "e3": 0, "e4": 0}), max_nodes=1)
    assert len(plan.drained) == 1 and plan.not_tried == 3
    assert drain_plan(uniform_cluster({"e1": 0, "e2": 0}), max_nodes=2).not_tried == 0
    assert drain_plan(uniform_cluster({"e1": 0, "e2": 0})).not_tried == 0


def test_the_summary_says_so_and_names_the_flag():
    plan = drain_plan(uniform_cluster({"e1": 0, "e2": 0, "e3": 0}), max_nodes=2)
    text = _drain_text(plan, 3, max_nodes=2)
    assert "1 node(s) not tried (--max-nodes 2)" in text, text
    assert "not tried" not in _drain_text(drain_plan(uniform_cluster({"e1": 0})), 1, max_nodes=None)


def test_plan_drain_max_nodes_as_typed():
    r = CliRunner().invoke(main, ["plan", "--simulated", "--drain", "--max-nodes", "2", "--shape", "1"])
    assert r.exit_code == 0, r.output
    assert "2 of 36 GPU node(s) can be emptied" in r.output and "34 node(s) not tried (--max-nodes 2)" in r.output
    r = CliRunner().invoke(main, ["plan", "--simulated", "--drain", "--max-nodes", "2", "--shape", "1", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["drain"]["notTried"] == 34
