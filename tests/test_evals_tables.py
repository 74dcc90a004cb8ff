"""evals/: statistics, tables, resume and skip rules on hand-made run folders (fast; no model, no loop).

The end-to-end runs of the three scripts on the real loop are in test_evals_e2e.py.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from evals import common, compare_engineers

# --------------------------------------------------------------------------- statistics


def test_t_quantiles_and_interval():
    assert common.t975(1) == pytest.approx(12.7062)
    assert common.t975(2) == pytest.approx(4.3027)
    # beyond the table the expansion is within 1e-3 of the exact quantiles (t_{.975,40}=2.0211, 120: 1.9799)
    assert common.t975(40) == pytest.approx(2.0211, abs=1e-3)
    assert common.t975(120) == pytest.approx(1.9799, abs=1e-3)
    r = common.mean_ci([0.2, 0.4, 0.6])
    # mean 0.4, sd 0.2, half = 4.3027 * 0.2 / sqrt(3)
    assert r["mean"] == pytest.approx(0.4) and r["half"] == pytest.approx(4.3027 * 0.2 / math.sqrt(3))
    assert common.mean_ci([0.5])["half"] is None  # one seed: no interval, never a fake one
    lo, hi = common.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)


# --------------------------------------------------------------------------- fake run folders


def verdict_rows(seed: int, arm_bonus: float) -> list[dict]:
    """Benchmark verdict rows: 3/4/5 agents x wait 0.25/0.75 x sizes 3/4, 5 instances each, with a
    valid/optimal pattern that depends on the seed and the arm."""
    rows = []
    for agents in (3, 4, 5):
        for wait in (0.25, 0.75):
            for size in (3, 4):
                for j in range(5):
                    score = (j + seed + size) % 5 / 5 + arm_bonus - 0.1 * (agents - 3)
                    valid = score >= 0.4
                    rows.append({"id": f"a{agents}-w{wait}-s{size}-{j}", "size": size, "num_agents": agents,
                                 "tags": {"agents": agents, "wait": wait}, "text": "...",
                                 "valid": valid, "optimal": valid and j % 2 == 0,
                                 "failure": None if valid else "conflict"})
    return rows


def make_finished_run(run_dir: Path, seed: int, arm_bonus: float, engineer: str) -> None:
    (run_dir / "final").mkdir(parents=True)
    with open(run_dir / "final" / "eval.jsonl", "w") as f:
        for r in verdict_rows(seed, arm_bonus):
            f.write(json.dumps(r) + "\n")
    (run_dir / "final" / "metrics.json").write_text("{}\n")
    (run_dir / "report.md").write_text("# report\n")
    from nodes.context import build_settings

    settings = build_settings({"preset": "smoke", "engineer": engineer, "seed": str(seed), "run_dir": str(run_dir)}, {})
    settings.save(run_dir / "settings.json")
    for k in range(2):
        d = run_dir / f"stage_{k}"
        d.mkdir()
        with open(d / "eval.jsonl", "w") as f:
            for j in range(4):
                f.write(json.dumps({"id": f"v{j}", "size": 3, "valid": j <= k + (arm_bonus > 0), "optimal": False,
                                    "failure": None}) + "\n")
        ratios = [0.125] * 8 if k == 0 else [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]
        sizes = {str(s): {"data_ratio": r, "hole_ratio": 0.1, "wait_ratio": 0.5}
                 for s, r in zip(range(3, 11), ratios, strict=True)}
        (d / "config.json").write_text(json.dumps({"sizes": sizes, "num_agents": 2, "num_instances": 16}))


def write_config(path: Path, tmp: Path, engineers: list[str], seeds: list[int]) -> Path:
    path.write_text(
        f"# python -m evals.compare_engineers --config {path}\n"
        "preset: smoke\n"
        f"engineers: {json.dumps(engineers)}\n"
        f"seeds: {json.dumps(seeds)}\n"
        "baseline: fixed\n"
        f"out: {tmp / 'out'}\n"
        f"runs_dir: {tmp / 'runs'}\n"
    )
    return path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_grid(tmp_path):
    bonus = {"fixed": 0.0, "self": 0.2}
    for arm, b in bonus.items():
        for seed in (0, 1, 2):
            make_finished_run(tmp_path / "runs" / f"{arm}-s{seed}", seed, b, arm)
    return tmp_path


def no_graph_run(cmd, *args, **kwargs):
    raise AssertionError(f"a graph.run subprocess was started: {cmd}")


def test_finished_pairs_are_not_rerun_and_table_matches_raw_verdicts(finished_grid, monkeypatch, capsys):
    tmp = finished_grid
    cfg = write_config(tmp / "compare.yaml", tmp, ["self", "fixed"], [0, 1, 2])
    before = snapshot(tmp / "runs")
    monkeypatch.setattr(common, "_run_child", no_graph_run)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    for pair in ("self-s0", "self-s1", "self-s2", "fixed-s0", "fixed-s1", "fixed-s2"):
        assert f"[skip] {pair}: finished" in err
    assert snapshot(tmp / "runs") == before  # nothing in the run folders was touched
    events = (tmp / "out" / "events.log").read_text()
    assert "[start]" not in events and events.count("[skip]") == 6
    assert "WARNING" not in err  # the saved settings are what this config would start

    # Recompute every table cell from the raw verdict files, independently of evals.common.
    table = {(r["arm"], r["subset"], r["metric"]): r for r in csv.DictReader(open(tmp / "out" / "table.csv"))}
    for arm in ("self", "fixed"):
        for agents in (3, 4, 5):
            for metric in ("valid", "optimal"):
                rates = []
                for seed in (0, 1, 2):
                    rows = [json.loads(line) for line in open(tmp / "runs" / f"{arm}-s{seed}" / "final" / "eval.jsonl")]
                    sub = [r for r in rows if r["tags"]["agents"] == agents]
                    rates.append(sum(bool(r[metric]) for r in sub) / len(sub))
                row = table[(arm, f"agents_{agents}", metric)]
                assert float(row["mean"]) == pytest.approx(statistics.fmean(rates))
                half = common.t975(2) * statistics.stdev(rates) / math.sqrt(3)
                assert float(row["ci95_half"]) == pytest.approx(half)
                if arm == "self":
                    base = [float(v) for v in json.loads(table[("fixed", f"agents_{agents}", metric)]["per_seed"]).values()]
                    gap = statistics.fmean(r - b for r, b in zip(rates, base, strict=True))
                    assert float(row["gap_mean"]) == pytest.approx(gap)
        # wait subsets pool all agent counts and sizes
        rows = [json.loads(line) for line in open(tmp / "runs" / f"{arm}-s0" / "final" / "eval.jsonl")]
        sub = [r for r in rows if r["tags"]["wait"] == 0.75]
        assert json.loads(table[(arm, "wait_0.75", "valid")]["per_seed"])["0"] == pytest.approx(
            sum(r["valid"] for r in sub) / len(sub))

    md = (tmp / "out" / "table.md").read_text()
    assert md.startswith("# Engineers compared")
    assert "| self | 3 |" in md and "Gap to `fixed`" in md
    assert f"python -m evals.compare_engineers --config {cfg}" in md
    for png in ("validation_per_stage.png", "allocation.png"):
        assert (tmp / "out" / png).stat().st_size > 1000
    # the verdict files were copied next to the table, and --tables-only rebuilds the same numbers from them
    assert (tmp / "out" / "verdicts" / "self-s1" / "final" / "eval.jsonl").is_file()
    assert not list((tmp / "out" / "verdicts").rglob("checkpoint"))
    first = (tmp / "out" / "table.csv").read_text()
    assert compare_engineers.main(["--config", str(cfg), "--tables-only"]) == 0
    assert (tmp / "out" / "table.csv").read_text() == first


def test_missing_key_is_a_visible_skip(finished_grid, monkeypatch, capsys):
    tmp = finished_grid
    for var in ("OPENAI_API_KEY", "GEMINI_API_KEY", "ENGINEER_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    cfg = write_config(tmp / "compare.yaml", tmp, ["fixed", "openai", "gemini"], [0, 1])
    monkeypatch.setattr(common, "_run_child", no_graph_run)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    for eng in ("openai", "gemini"):
        line = next(line for line in err.splitlines() if line.startswith(f"[skip] engineer {eng}:"))
        assert "key" in line.lower()
    md = (tmp / "out" / "table.md").read_text()
    assert "`openai` skipped:" in md and "`gemini` skipped:" in md  # also noted under the table
    assert json.loads((tmp / "out" / "table.json").read_text())["skipped"].keys() == {"openai", "gemini"}


def test_dry_run_plans_without_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "_run_child", no_graph_run)
    make_finished_run(tmp_path / "runs" / "fixed-s0", 0, 0.0, "fixed")
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "random"], [0, 1])
    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "[skip] fixed-s0: finished" in err
    for pair in ("fixed-s1", "random-s0", "random-s1"):
        line = next(line for line in err.splitlines() if line.startswith(f"[plan] {pair}:"))
        assert "-m graph.run --preset smoke" in line and f"--seed {pair[-1]}" in line
    assert "nothing was started" in err
    assert not (tmp_path / "runs" / "random-s0").exists() and not (tmp_path / "out" / "events.log").exists()


def test_bad_config_and_bad_setting_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# cmd\npreset: smoke\nengineers: [fixed]\nseeds: [0]\nout: o\nbogus: 1\n")
    assert compare_engineers.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config") and "bogus" in err and len(err.splitlines()) == 1
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed"], [0])
    cfg.write_text(cfg.read_text() + "set: {eval_limit: -3}\n")
    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "[error] fixed-s0: bad setting eval_limit" in err


def test_committed_verdicts_count_as_finished_without_run_folders(finished_grid, monkeypatch, capsys):
    """A grid built up over several sittings: the run folders are gone, the committed verdicts remain."""
    import shutil

    tmp = finished_grid
    cfg = write_config(tmp / "compare.yaml", tmp, ["self", "fixed"], [0, 1, 2])
    monkeypatch.setattr(common, "_run_child", no_graph_run)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    first = (tmp / "out" / "table.csv").read_text()
    shutil.rmtree(tmp / "runs")
    shutil.rmtree(tmp / "out" / "verdicts" / "self-s2")  # this pair was never committed: it must run
    started = []

    def fake_child(cmd, log_path, name, timeout_s, env):
        started.append(name)
        return 1, 0.0

    monkeypatch.setattr(common, "_run_child", fake_child)
    capsys.readouterr()
    assert compare_engineers.main(["--config", str(cfg)]) == 1  # self-s2 did not finish
    err = capsys.readouterr().err
    for pair in ("self-s0", "self-s1", "fixed-s0", "fixed-s1", "fixed-s2"):
        assert f"[skip] {pair}: finished earlier, verdicts kept in" in err
    assert started == ["self-s2"]
    table = (tmp / "out" / "table.csv").read_text()
    assert table != first and "fixed" in table  # rebuilt from the five kept pairs
