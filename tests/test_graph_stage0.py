"""`python -m graph.run --stage0-from DONOR`: a new run that starts from another run's finished stage 0.

Fast tests build a donor folder by hand (settings.json, stage_0 files, and graph.sqlite holding the states
apply / train_stage / evaluate would have written); the slow test shares a real donor's stage 0 on the
smoke preset with another engineer and checks that the fork never trains stage 0."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from graph.settings import RunContext, Settings, build_settings
from graph.stage0 import MAY_DIFFER, check_donor, compare_settings, seed_from_donor, update_as_evaluate
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], env_extra: dict[str, str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k not in ("ENGINEER", "PRESET", "STAGES", "RUN_DIR", "SEED")}
    env.update({**env_extra, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    return subprocess.run([sys.executable, "-m", "graph.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def open_graph(run_dir: Path):
    from langgraph.checkpoint.sqlite import SqliteSaver

    from graph.graph import make_graph

    conn = sqlite3.connect(str(run_dir / "graph.sqlite"), check_same_thread=False)
    return make_graph(checkpointer=SqliteSaver(conn)), conn


def make_donor(tmp_path: Path, *, upto: str = "evaluate", seed: int = 0) -> tuple[Path, Settings]:
    """A donor run folder whose graph.sqlite holds the states written after apply, train_stage and (with
    upto="evaluate") evaluate of stage 0, as a real run writes them; stage_0 holds small stand-in files."""
    donor = tmp_path / "donor"
    s0 = donor / "stage_0"
    (s0 / "checkpoint").mkdir(parents=True)
    (s0 / "tb" / "sft").mkdir(parents=True)
    settings = build_settings({"engineer": "fixed", "seed": str(seed)}, {"PRESET": "smoke"})
    settings = settings.model_copy(update={"run_dir": donor})
    settings.save(donor / "settings.json")
    for name, text in {"config.json": '{"sizes": {}}\n', "train.jsonl": "{}\n", "env_stats.json": "{}\n",
                       "eval.jsonl": '{"id": 1}\n', "metrics.json": '{"eval/valid_rate": 0.5}\n',
                       "checkpoint/model.safetensors": "w", "tb/sft/events": "e",
                       # engineer-side files and leftovers that a fork must not share
                       "summary.md": "s", "engineer_prompt.md": "p", "engineer_reply.md": "r",
                       "validation.json": "{}", "policy-vllm.log": "l"}.items():
        (s0 / name).write_text(text)
    graph, conn = open_graph(donor)
    cfg = {"configurable": {"thread_id": "donor"}}
    graph.update_state(cfg, {"stage": 0, "config": {"sizes": {}}, "train_path": str(s0 / "train.jsonl"),
                             "history": [], "log": ["stage 0: generated 16 training instances"]}, as_node="apply")
    if upto in ("train_stage", "evaluate"):
        graph.update_state(cfg, {"checkpoint": str(s0 / "checkpoint"), "reward_state": {"n": 1},
                                 "log": [f"stage 0: trained 2 GRPO steps in 1 s, reward 0.0 -> {s0 / 'checkpoint'}"]},
                           as_node="train_stage")
    if upto == "evaluate":
        update_as_evaluate(graph, cfg, {"metrics": {"eval/valid_rate": 0.5}, "log": ["stage 0: eval on val-mini"]},
                           RunContext(settings=settings, run_dir=donor))
    conn.close()
    return donor, settings


def test_update_state_as_evaluate_needs_the_runtime(tmp_path):
    """Pins the LangGraph behaviour update_as_evaluate works around: plain update_state(as_node="evaluate")
    cannot run route_after_evaluate (it reads runtime.context). When this starts to pass without the
    workaround, update_as_evaluate can become a plain update_state."""
    donor, settings = make_donor(tmp_path, upto="train_stage")
    graph, conn = open_graph(donor)
    cfg = {"configurable": {"thread_id": "donor"}}
    try:
        with pytest.raises(Exception, match="Missing required config key"):
            graph.update_state(cfg, {"metrics": {}}, as_node="evaluate")
        update_as_evaluate(graph, cfg, {"metrics": {}}, RunContext(settings=settings, run_dir=donor))
        assert graph.get_state(cfg).next == ("summarize_failures",)
    finally:
        conn.close()


def test_seed_from_donor_links_stage_0_and_moves_paths(tmp_path):
    donor, dsettings = make_donor(tmp_path)
    settings = build_settings({"engineer": "random", "context": "V1"}, {"PRESET": "smoke"})
    found = check_donor(donor, settings)
    assert found.values["stage"] == 0 and found.timings["stage0_s"] is not None
    run_dir = tmp_path / "fork"
    run_dir.mkdir()
    settings = settings.model_copy(update={"run_dir": run_dir})
    record = seed_from_donor(found, run_dir, settings)
    s0 = run_dir / "stage_0"
    for name in ("config.json", "train.jsonl", "env_stats.json", "eval.jsonl", "metrics.json",
                 "checkpoint/model.safetensors", "tb/sft/events"):
        assert os.stat(s0 / name).st_ino == os.stat(donor / "stage_0" / name).st_ino, name  # hard links
    for name in ("summary.md", "engineer_prompt.md", "engineer_reply.md", "validation.json", "policy-vllm.log"):
        assert not (s0 / name).exists(), name
    graph, conn = open_graph(run_dir)
    try:
        snap = graph.get_state({"configurable": {"thread_id": "fork"}})
    finally:
        conn.close()
    assert snap.next == ("summarize_failures",) and snap.metadata["source"] == "update"
    # state paths are relative to the fork's folder (graph.runfolder): the fork reads its own links
    assert snap.values["train_path"] == "stage_0/train.jsonl"
    assert snap.values["checkpoint"] == "stage_0/checkpoint"
    assert snap.values["reward_state"] == {"n": 1} and snap.values["metrics"] == {"eval/valid_rate": 0.5}
    log = snap.values["log"]
    assert log[0].startswith("stage 0: shared from donor") and all("[shared from donor donor]" in ln for ln in log[1:])
    assert [ln for ln in log if re.match(r"stage 0: trained ", ln)]  # "trained once" bookkeeping still reads right
    saved = json.loads((run_dir / "stage0_from.json").read_text())
    assert saved == record and saved["donor"] == str(donor.resolve())
    assert saved["donor_checkpoint_id"] == found.checkpoint_id and saved["files"]["linked"] == 7
    from nodes.report import collect, render

    assert f"Stage 0 was shared from the donor run `{donor.resolve()}`" in render(collect(run_dir), [], "fork")


def test_compare_settings_names_the_field():
    base = build_settings({"engineer": "fixed"}, {"PRESET": "smoke"})
    other = build_settings({"engineer": "openai", "context": "V2", "engineer_max_attempts": "7",
                            "run_dir": "/x", "approve": "true"}, {"PRESET": "smoke"})
    assert compare_settings(other, base) is None  # engineer-side and run-side fields may differ
    lr = build_settings({"train.learning_rate": "0.5"}, {"PRESET": "smoke"})
    assert compare_settings(lr, base) == ("train.learning_rate", 0.5, base.train.learning_rate)
    assert compare_settings(build_settings({"eval_limit": "2"}, {"PRESET": "smoke"}), base)[0] == "eval_limit"
    # a renamed field must not silently become shareable
    assert {f for f in MAY_DIFFER if not f.startswith("train.")} <= set(Settings.model_fields)
    assert {f[6:] for f in MAY_DIFFER if f.startswith("train.")} <= set(TrainConfig.model_fields)


@pytest.mark.parametrize(
    "donor_kind, args, needle",
    [
        ("missing", [], "no settings.json there"),
        ("not_run", [], "no graph.sqlite there"),
        ("before_evaluate", [], "has not finished stage 0's evaluate"),
        ("pruned", [], "its stage-0 weights were deleted once a later stage's checkpoint was saved (its "
                       "stage_0/pruned.json: the donor ran with keep_checkpoints=last)"),
        ("no_weights", [], "its stage-0 weights are missing"),
        ("ok", ["--seed", "1"], "setting seed differs: this run 1, donor 0"),
        ("ok", ["--set", "train.max_steps=9"], "setting train.max_steps differs: this run 9, donor 2"),
        ("ok", ["--stages", "1"], "sharing stage 0 needs stages >= 2"),
        ("ok", ["--resume", "somewhere"], "cannot be combined with --resume"),
    ],
)
def test_stage0_from_errors_one_line_no_run_folder(tmp_path, donor_kind, args, needle):
    if donor_kind == "missing":
        donor = tmp_path / "no_such_donor"
    elif donor_kind == "not_run":
        donor = tmp_path / "plain"
        donor.mkdir()
        build_settings({}, {"PRESET": "smoke"}).save(donor / "settings.json")
    else:
        donor, _ = make_donor(tmp_path, upto="train_stage" if donor_kind == "before_evaluate" else "evaluate")
        if donor_kind == "pruned":  # keep_checkpoints=last: stage 1's checkpoint saved, stage 0's weights deleted
            from graph.prune import prune_older

            assert prune_older(donor, 1, donor / "stage_1" / "checkpoint") == [0]
        elif donor_kind == "no_weights":
            (donor / "stage_0" / "checkpoint" / "model.safetensors").unlink()
    run_dir = tmp_path / "fork"
    r = run_cli(["--stage0-from", str(donor), "--run-dir", str(run_dir), "--engineer", "random", *args],
                {"PRESET": "smoke"}, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert needle in lines[0]
    assert not run_dir.exists()


def test_stage0_from_dry_run_checks_the_donor(tmp_path):
    donor, _ = make_donor(tmp_path)
    run_dir = tmp_path / "fork"
    r = run_cli(["--dry-run", "--stage0-from", str(donor), "--run-dir", str(run_dir), "--engineer", "random"],
                {"PRESET": "smoke"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[dry-run] stage 0 would be shared from" in r.stderr
    assert not (run_dir / "stage_0").exists() and not (run_dir / "graph.sqlite").exists()


# ----------------------------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_fork_shares_stage_0_and_trains_only_later_stages(tmp_path, smoke_grid):
    """A `random`-engineer fork of the session grid's finished `fixed-s0` run (conftest ``smoke_grid``)."""
    from tests.support.run_folder import train_stage_runs
    from tests.support.smoke_grid import set_args

    donor, fork = smoke_grid[0] / "runs" / "fixed-s0", tmp_path / "fork"
    r = run_cli(["--run-dir", str(fork), "--engineer", "random", "--seed", "0", "--stage0-from", str(donor),
                 *set_args()], {"PRESET": "smoke"}, tmp_path, 1800)
    assert r.returncode == 0, r.stderr[-3000:]
    err = r.stderr
    assert "stage 0 shared from" in err
    assert "[stage 0] train_stage" not in err and "[stage 0] trained" not in err and "[stage 0] evaluate" not in err
    assert "[stage 1] train_stage" in err and "[stage 1] trained" in err
    for name in ("eval.jsonl", "metrics.json", "config.json", "train.jsonl", "env_stats.json"):
        assert (fork / "stage_0" / name).read_bytes() == (donor / "stage_0" / name).read_bytes(), name
    # the fork's engineer files are its own: the random engineer proposed stage 1 from the shared evidence
    assert json.loads((fork / "stage_0" / "validation.json").read_text())["decisions"]
    assert os.stat(fork / "stage_0" / "summary.md").st_ino != os.stat(donor / "stage_0" / "summary.md").st_ino
    assert (fork / "stage_1" / "checkpoint").is_dir() and (fork / "stage_1" / "metrics.json").is_file()
    assert (fork / "final" / "metrics.json").is_file()
    # graph.sqlite: the fork's only stage-0 checkpoint is the seeded one; train_stage never ran for stage 0
    graph, conn = open_graph(fork)
    try:
        history = list(graph.get_state_history({"configurable": {"thread_id": "fork"}}))
    finally:
        conn.close()
    stage0 = [s for s in history if s.values.get("stage") == 0]
    assert [s.metadata["source"] for s in stage0 if s.next == ("summarize_failures",)] == ["update"]
    assert not [s for s in stage0 if s.next in (("train_stage",), ("evaluate",))]
    assert history[-1].metadata["source"] == "update"  # the thread starts with the donor's state
    assert train_stage_runs(fork) == [0, 1]  # the donor's stage-0 line (marked) plus the fork's stage 1
    report = (fork / "report.md").read_text()
    assert "Stage 0 was shared from the donor run" in report
    assert json.loads((fork / "stage0_from.json").read_text())["donor"] == str(donor.resolve())
