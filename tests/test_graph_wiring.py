"""The graph's wiring and the run loop of `python -m graph.run`, in-process and fast: the slow nodes
(train_stage, evaluate, summarize_failures, propose_config, final_evaluate, report) are replaced by stubs;
apply and validate_config are the real ones. Covers the recursion limit, langgraph.json's entry point,
progress lines, and --approve (resume at the prompt, a person's edit checked and recorded)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
from langgraph.errors import GraphRecursionError

import graph.graph as gg
from env import SIZES
from graph import approve, loop, progress
from graph.settings import RunContext
from tests.support.graph_stubs import settings_for, sizes

ROOT = Path(__file__).resolve().parents[1]


def test_langgraph_json_entry_compiles():
    """langgraph.json names a file and a function; LangGraph's tooling loads it by path and calls it."""
    spec = json.loads((ROOT / "langgraph.json").read_text())
    (name, entry), = spec["graphs"].items()
    path, attr = entry.split(":")
    mod_spec = importlib.util.spec_from_file_location("lg_entry", ROOT / path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    compiled = getattr(module, attr)()
    assert {"apply", "train_stage", "evaluate", "summarize_failures", "propose_config", "validate_config",
            "final_evaluate", "report"} <= set(compiled.get_graph().nodes)
    assert "route_after_evaluate" not in compiled.get_graph().nodes  # routes are edges, not nodes


def test_recursion_limit_covers_every_retry(tmp_path, monkeypatch, stub_nodes):
    """Every proposal unusable: each stage but the last takes 4 + 2 * engineer_max_attempts supersteps. 20
    stages at 10 attempts need 461, more than the old `50 + 20 * stages` = 450; recursion_limit() suffices."""

    def validate_config(state, runtime):  # every proposal unusable until the attempts run out
        a, most = int(state["attempts"]), runtime.context.settings.engineer_max_attempts
        if a < most:
            return {"decision": "retry", "accepted": None, "attempts": a, "feedback": ["bad"]}
        return {"decision": "kept_previous", "accepted": state["config"], "attempts": a}

    def apply(state, runtime):  # no data: only the stage moves on
        return {"stage": state["stage"] + 1 if "stage" in state else 0, "config": {"sizes": {}}, "train_path": "x"}

    monkeypatch.setattr(gg, "validate_config", validate_config)
    monkeypatch.setattr(gg, "apply", apply)
    settings, run_dir = settings_for(tmp_path, stages=20, engineer_max_attempts=10)
    ctx = RunContext(settings=settings, run_dir=run_dir)
    with pytest.raises(GraphRecursionError):
        gg.make_graph().invoke({}, {"recursion_limit": 50 + 20 * 20}, context=ctx)
    final = loop.run_graph(run_dir, settings, resume=False)
    assert final["stage"] == 19 and final["final_metrics"]


def test_progress_lines_start_and_compact_diff(tmp_path, stub_nodes, capsys):
    settings, run_dir = settings_for(tmp_path, stages=2, seed=5)
    loop.run_graph(run_dir, settings, resume=False)
    err = capsys.readouterr().err
    for start in ("[stage 0] apply: generating", "[stage 0] train_stage", "[stage 0] evaluate on",
                  "[stage 0] summarize_failures", "[stage 0] propose_config: asking the fixed engineer",
                  "[stage 1] apply: generating", "[stage 1] train_stage", "[final] final_evaluate on"):
        assert start in err, (start, err)
    assert "[stage 0] failures summarized" in err
    record = json.loads((run_dir / "stage_0" / "validation.json").read_text())["decisions"][-1]
    line = next(ln for ln in err.splitlines() if "engineer proposal: accepted" in ln)
    assert progress.diff_summary(record["diff"]) in line and "size(s) changed" not in line
    assert "3x3 data " in line and "->" in line and "more" in line  # 24 knobs moved: capped


def test_diff_summary_is_compact():
    diff = {"7": {"wait_ratio": {"from": 0.5, "to": 0.25}}, "5": {"data_ratio": {"from": 0.12, "to": 0.18}},
            "10": {"hole_ratio": {"from": 0.1004, "to": 0.1001}}}
    assert progress.diff_summary(diff) == "5x5 data .12->.18, 7x7 wait .50->.25, 10x10 hole .100->.100"
    assert progress.diff_summary({}) == "no change"
    many = {str(n): {"data_ratio": {"from": 0.1, "to": 0.2}} for n in SIZES}
    assert progress.diff_summary(many, cap=3).endswith(", +5 more")


def _approve_run(tmp_path, monkeypatch, answers: str, resume: bool, settings, run_dir):
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    return loop.run_graph(run_dir, settings, resume=resume)


def test_approve_resume_at_the_prompt_asks_and_records_the_edit(tmp_path, monkeypatch, stub_nodes, capsys):
    """The process dies while waiting at the --approve prompt (here: end of input); --resume asks again
    before streaming, the edited file goes through projection and feasibility, and validation.json holds
    the person's decision, which the report shows."""
    settings, run_dir = settings_for(tmp_path, stages=2, approve="true")
    with pytest.raises(progress.RunError, match="standard input"):
        _approve_run(tmp_path, monkeypatch, "", False, settings, run_dir)
    # data ratios summing to 2 fail strict validation: the person's config is projected like an engineer's
    (tmp_path / "edited.json").write_text(json.dumps({"sizes": sizes({5: 1.0, 6: 1.0})}))
    (tmp_path / "bad.json").write_text("{not json")
    # the editor writes a bad file the first time, the edited config the second
    editor = tmp_path / "editor.sh"
    editor.write_text(f"#!/bin/sh\nif [ -f {tmp_path}/once ]; then cp {tmp_path}/edited.json \"$1\"; "
                      f"else touch {tmp_path}/once; cp {tmp_path}/bad.json \"$1\"; fi\n")
    editor.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(editor))
    monkeypatch.delenv("VISUAL", raising=False)
    capsys.readouterr()
    _approve_run(tmp_path, monkeypatch, "e\ne\n", True, settings, run_dir)
    err = capsys.readouterr().err
    assert err.count(approve.APPROVE_PROMPT) == 2  # the bad edit got a line and another prompt
    assert "cannot use the edit" in err and "projected onto allowed values" in err
    cfg = json.loads((run_dir / "stage_1" / "config.json").read_text())["sizes"]
    assert cfg["5"]["data_ratio"] == pytest.approx(0.5) and cfg["3"]["data_ratio"] == 0
    doc = json.loads((run_dir / "stage_0" / "validation.json").read_text())
    person = doc["decisions"][-1]
    assert person["by"] == "person" and person["decision"] == "edited (person)" == doc["final"]
    assert person["accepted"]["sizes"]["5"]["data_ratio"] == pytest.approx(0.5)
    assert person["feasibility"]["ok"] and person["diff"]["5"]["data_ratio"]["to"] == pytest.approx(0.5)
    from nodes.report import collect, render

    text = render(collect(run_dir), [], "t")
    assert "Person's decision (--approve): **edited (person)**" in text
    assert "after 1 attempt(s)" in text  # the person's record is not counted as an engineer attempt


def test_approve_keep_is_recorded(tmp_path, monkeypatch, stub_nodes):
    settings, run_dir = settings_for(tmp_path, stages=2, approve="true")
    _approve_run(tmp_path, monkeypatch, "n\n", False, settings, run_dir)
    doc = json.loads((run_dir / "stage_0" / "validation.json").read_text())
    assert doc["final"] == "kept_previous (person)" and doc["decisions"][-1]["by"] == "person"
    s0 = json.loads((run_dir / "stage_0" / "config.json").read_text())
    assert json.loads((run_dir / "stage_1" / "config.json").read_text())["sizes"] == s0["sizes"]


def test_paper_table_in_report():
    from nodes.report import paper_table_md

    final = {"by_agents": {"3": {}, "4": {}, "5": {}}, "final/valid_rate/agents_3": 0.5167,
             "final/optimal_rate/agents_3": 0.3167, "final/valid_rate/agents_4": 0.3314,
             "final/optimal_rate/agents_4": 0.2133}
    table = paper_table_md(final, "run-x")
    assert "| run | 3 agents | 4 agents | 5 agents |" in table
    assert "| run-x | 51.67 / 31.67 | 33.14 / 21.33 | – |" in table
