"""Reproduce on purpose: the eval scripts take `--out DIR` or `--fresh`, committed results folders are
never overwritten, and a config whose settings differ from its committed results refuses to mix them in one line.

Fast: dry runs, `--tables-only` on copies of committed verdicts, and `run_grid` replaced by a stub that fails the
test if anything would start (no model, no loop).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from evals import ablate_context, compare_engineers, config, grid, loop, pairs, results

REPO = config.REPO_ROOT
COMMITTED = REPO / "evals" / "results" / "compare_smoke"


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _config(tmp_path: Path, body: str, module: str = "evals.compare_engineers") -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"# python -m {module} --config {cfg}\n{body}")
    return cfg


@pytest.fixture
def no_runs(monkeypatch):
    """Any attempt to run the grid for real (not a dry run) fails the test."""
    real = loop.run_grid
    calls = []

    def guarded(pairs, **kw):
        calls.append((list(pairs), kw))
        if not kw.get("dry_run"):
            return grid.GridResult()
        return real(pairs, **kw)

    monkeypatch.setattr(loop, "run_grid", guarded)
    return calls


def _committed_eval_limit() -> int:
    from evals.packed import PACK, read_text

    return json.loads(read_text(f"{COMMITTED / PACK}:verdicts/fixed-s0/settings.json"))["eval_limit"]


def test_committed_detects_tracked_results(tmp_path):
    assert results.committed(COMMITTED)
    assert results.committed(COMMITTED / "answers.tar.xz")  # its verdicts, packed
    assert not results.committed(tmp_path)  # outside the repository
    assert not results.committed(REPO / "runs" / "evals")  # inside it, but nothing tracked there


@pytest.mark.parametrize("dry", [True, False])
def test_other_settings_than_the_committed_results_refuse_in_one_line(tmp_path, capsys, no_runs, dry):
    before = _tree(COMMITTED)
    cfg = _config(tmp_path, "preset: smoke\nengineers: [fixed]\nseeds: [0]\n"
                            f"out: {COMMITTED.relative_to(REPO)}\nruns_dir: {tmp_path / 'runs'}\n"
                            f"set: {{eval_limit: {_committed_eval_limit() + 1}}}\n")
    rc = compare_engineers.main(["--config", str(cfg), *(["--dry-run"] if dry else [])])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: evals/results/compare_smoke holds committed results made with other settings")
    assert f"eval_limit: {_committed_eval_limit()} -> {_committed_eval_limit() + 1}" in lines[0]
    assert "--fresh" in lines[0] and "--out DIR" in lines[0]
    assert not no_runs  # refused before the grid: nothing planned, nothing started
    assert _tree(COMMITTED) == before
    assert not (tmp_path / "runs").exists()


def test_ablate_refuses_the_same_way(tmp_path, capsys, no_runs):
    cfg = _config(tmp_path, "preset: smoke\nengineer: fixed\nvariants: [V1]\nseeds: [0]\n"
                            f"out: {COMMITTED.relative_to(REPO)}\nruns_dir: {tmp_path / 'runs'}\n"
                            f"set: {{eval_limit: {_committed_eval_limit() + 1}}}\n", "evals.ablate_context")
    assert ablate_context.main(["--config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # its arms (V1-s0) are not among the committed runs: the folder is another config's, never written into
    assert len(err) == 1 and "holds committed results of other runs than this config's (fixed-s0" in err[0]
    assert "--fresh" in err[0]
    assert not no_runs
    assert ablate_context.main(["--config", str(cfg), "--dry-run", "--out", str(tmp_path / "mine")]) == 0


def test_out_plans_and_writes_elsewhere(tmp_path, capsys, no_runs):
    before = _tree(COMMITTED)
    cfg = _config(tmp_path, "preset: smoke\nengineers: [fixed, self]\nseeds: [0, 1]\nbaseline: fixed\n"
                            f"out: {COMMITTED.relative_to(REPO)}\nruns_dir: runs/evals/compare_smoke\n"
                            f"set: {{eval_limit: {_committed_eval_limit() + 1}}}\n")
    mine = tmp_path / "mine"
    # the plan: every run new, in run folders of its own (runs/evals/<out name>), none finished
    assert compare_engineers.main(["--config", str(cfg), "--dry-run", "--out", str(mine)]) == 0
    err = capsys.readouterr().err
    assert "[dry-run] 4 run(s) planned, 0 finished" in err
    assert f"--run-dir runs/evals/{mine.name}/fixed-s0" in err
    pairs, kw = no_runs[-1]
    assert kw["out"] == mine and all(p.run_dir.parent == REPO / "runs" / "evals" / mine.name for p in pairs)
    # for real (the grid stubbed, so no run finishes: exit 1, no table): it runs into --out, not the config's out
    assert compare_engineers.main(["--config", str(cfg), "--out", str(mine)]) == 1
    assert no_runs[-1][1]["out"] == mine and not no_runs[-1][1]["dry_run"]
    # the tables of a reproduction go to --out: rebuilt there from its verdicts, the committed folder untouched
    mine.mkdir(parents=True, exist_ok=True)
    shutil.copy(COMMITTED / "answers.tar.xz", mine / "answers.tar.xz")
    assert compare_engineers.main(["--config", str(cfg), "--tables-only", "--out", str(mine)]) == 0
    assert (mine / "table.md").is_file() and (mine / "table.json").is_file()
    assert _tree(COMMITTED) == before


def test_fresh_is_a_new_timestamped_folder_beside_the_committed_one(tmp_path):
    cfg = config.load_config(_config(tmp_path, "engineers: [fixed]\nseeds: [0]\nout: evals/results/compare_smoke\n"
                                               "runs_dir: runs/evals/compare_smoke\n"), compare_engineers.CompareConfig)
    new = results.retarget(cfg, fresh=True)
    out = new.resolved_out()
    assert out.parent == COMMITTED.parent and out.name.startswith("compare_smoke-20") and not out.exists()
    assert new.resolved_runs_dir() == REPO / "runs" / "evals" / out.name
    assert not results.committed(out)
    assert results.retarget(cfg) is cfg  # neither flag: the config as it is
    with pytest.raises(config.EvalConfigError, match="--out and --fresh both given"):
        results.retarget(cfg, out=tmp_path / "x", fresh=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(config.EvalConfigError, match="is a file"):
        results.retarget(cfg, out=tmp_path / "file")


def test_fresh_with_tables_only_is_refused(tmp_path, capsys):
    cfg = _config(tmp_path, "engineers: [fixed]\nseeds: [0]\nout: evals/results/compare_smoke\n")
    assert compare_engineers.main(["--config", str(cfg), "--fresh", "--tables-only"]) == 2
    assert "--fresh --tables-only" in capsys.readouterr().err


# ----------------------------------------------------------------- a committed folder with the same settings


@pytest.fixture
def committed_out(tmp_path, monkeypatch):
    """A results folder that counts as committed, holding fixed-s0's verdicts made with this config's settings."""
    from graph.settings import build_settings

    out = tmp_path / "results"
    for module in (pairs, loop):  # guard_committed and run_loop_eval each ask
        monkeypatch.setattr(module, "committed", lambda p: Path(p).resolve() == out.resolve())
    pair = pairs.make_pairs([pairs.Arm("fixed", "fixed")], [0], tmp_path / "runs")[0]
    kept = out / "verdicts" / "fixed-s0"
    (kept / "final").mkdir(parents=True)
    build_settings(pair.cli_values("smoke", {}), dict(os.environ)).save(kept / "settings.json")
    (kept / "final" / "eval.jsonl").write_text('{"id": "x", "valid": false}\n')
    return out


def test_same_settings_all_committed_is_not_a_silent_no_op(tmp_path, capsys, no_runs, committed_out):
    cfg = _config(tmp_path, f"preset: smoke\nengineers: [fixed]\nseeds: [0]\nout: {committed_out}\n"
                            f"runs_dir: {tmp_path / 'runs'}\n")
    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds the committed results of this config (1 runs); nothing to run" in err[0]
    assert "--fresh" in err[0] and "--tables-only" in err[0]


def test_same_settings_continue_the_grid_and_keep_committed_verdicts(tmp_path, capsys, no_runs, committed_out):
    cfg = _config(tmp_path, f"preset: smoke\nengineers: [fixed]\nseeds: [0, 1]\nout: {committed_out}\n"
                            f"runs_dir: {tmp_path / 'runs'}\n")
    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "continuing the committed grid" in err and "1 committed run(s) kept as they are, 1 to run" in err
    assert "[plan] fixed-s1" in err and "[plan] fixed-s0" not in err
    # a local finished run of fixed-s0 with other answers never overwrites its committed verdicts
    kept = committed_out / "verdicts" / "fixed-s0" / "final" / "eval.jsonl"
    before = kept.read_bytes()
    local = tmp_path / "runs" / "fixed-s0"
    (local / "final").mkdir(parents=True)
    shutil.copyfile(committed_out / "verdicts" / "fixed-s0" / "settings.json", local / "settings.json")
    (local / "final" / "eval.jsonl").write_text('{"id": "x", "valid": true}\n')
    (local / "final" / "metrics.json").write_text("{}\n")
    (local / "report.md").write_text("done\n")
    pair0 = pairs.make_pairs([pairs.Arm("fixed", "fixed")], [0], tmp_path / "runs")[0]
    loop.run_grid = lambda pairs, **kw: grid.GridResult(finished=[pair0])  # restored by monkeypatch (no_runs)
    compare_engineers.main(["--config", str(cfg)])
    assert kept.read_bytes() == before


def test_repository_configs_pointing_at_committed_folders_still_plan_with_fresh(capsys):
    """Every committed config reproduces with --fresh (a dry run: settings checked, nothing started)."""
    for name in ("compare_smoke.yaml", "compare_cpu.yaml"):
        assert compare_engineers.main(["--config", str(REPO / "evals" / "configs" / name), "--dry-run",
                                       "--fresh"]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "note: results go to evals/results/compare_cpu-20" in err
    tracked = subprocess.run(["git", "status", "--porcelain", "--", "evals/results"], cwd=REPO,
                             capture_output=True, text=True).stdout
    assert "compare_smoke-20" not in tracked and "compare_cpu-20" not in tracked  # a dry run makes no folder


def test_a_config_names_only_a_graph_run_preset(tmp_path):
    """A preset graph.run does not know is refused when the config is read, in one line naming it, not run by run
    after the grid has started; `cpu-long` is one it knows."""
    body = "engineers: [fixed]\nseeds: [0]\nout: evals/results/compare_smoke\npreset: {}\n"
    cfg = config.load_config(_config(tmp_path, body.format("cpu-long")), compare_engineers.CompareConfig)
    assert cfg.preset == "cpu-long"
    with pytest.raises(config.EvalConfigError, match=r"field preset='cpu-lng'.*allowed: smoke, cpu, cpu-long, rg-cpu, paper"):
        config.load_config(_config(tmp_path, body.format("cpu-lng")), compare_engineers.CompareConfig)
