"""evals/ end to end on the real loop: compare_engineers on the smoke preset with the `fixed` and `random` engineers
and two seeds, and ablate_context with the `self` engineer, each `python -m graph.run` a real subprocess with the
embedded model. Checks that the table is what the raw verdict files say, that stage 0 is trained once per seed and
shared (`graph.run --stage0-from`), and that a rerun redoes nothing.

The smoke preset is shrunk further through the configs' `set:` (the same overrides for every run, as a
user would) and the self-engineer answers in-process (ENGINEER_SERVING=transformers: no vLLM start-up;
tests/test_graph_e2e.py covers vLLM), so the five loop runs take minutes on an idle 2-core machine."""

from __future__ import annotations

import csv
import hashlib
import json
import statistics
from pathlib import Path

import pytest

from tests.support.run_folder import snapshot
from tests.support.smoke_grid import evals_cmd, run_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def rates_from_raw(run_dir: Path, metric: str, keep) -> float:
    """valid (or optimal) share of the final benchmark rows that `keep` selects, counted by hand."""
    rows = [json.loads(line) for line in (run_dir / "final" / "eval.jsonl").read_text().splitlines() if line]
    sub = [r for r in rows if keep(r)]
    return sum(1 for r in sub if r["valid"] and (metric == "valid" or r["optimal"])) / len(sub)


def subset_filter(sub: str):
    """Which verdict rows a table subset (`all`, `agents_3`, `wait_0.25`) pools."""
    if sub == "all":
        return lambda r: True
    if sub.startswith("agents_"):
        return lambda r: r["tags"]["agents"] == int(sub[7:])
    return lambda r: abs(float(r["tags"]["wait"]) - float(sub[5:])) < 1e-9


def check_table_against_raw(out: Path, runs: Path, arms: list[str], seeds: list[int], baseline: str) -> None:
    table = {(r["arm"], r["subset"], r["metric"]): r for r in csv.DictReader(open(out / "table.csv"))
             if r["layout"] == "pooled"}
    subsets = {s for (_, s, _) in table}
    assert any(s.startswith("agents_") for s in subsets) and "all" in subsets
    for (arm, sub, metric), row in table.items():
        if "/" in sub:
            continue
        keep = subset_filter(sub)
        if row["n_seeds"] == "0":  # a paper column with no instances in this small benchmark: shown empty
            assert row["mean"] == "" and not any(
                keep(json.loads(line)) for s in seeds
                for line in (runs / f"{arm}-s{s}" / "final" / "eval.jsonl").read_text().splitlines() if line)
            continue
        rates = [rates_from_raw(runs / f"{arm}-s{s}", metric, keep) for s in seeds]
        assert float(row["mean"]) == pytest.approx(statistics.fmean(rates)), (arm, sub, metric)
        # the interval (bootstrap over seeds and instances, or Wilson) stays a share
        assert 0 <= float(row["ci95_low"]) <= float(row["mean"]) <= float(row["ci95_high"]) <= 1, (arm, sub, metric)
        if arm != baseline:
            base = [rates_from_raw(runs / f"{baseline}-s{s}", metric, keep) for s in seeds]
            assert float(row["gap_mean"]) == pytest.approx(statistics.fmean(rates) - statistics.fmean(base))
    assert {a for (a, _, _) in table} == set(arms)


@pytest.fixture
def compared(smoke_grid):
    """The session's smoke grid (conftest): also the stage-0 donor of the fork, approve and SIGKILL tests."""
    return smoke_grid


def test_compare_engineers_smoke(compared):
    tmp, cfg, proc = compared
    out, runs = tmp / "out", tmp / "runs"
    for pair in ("fixed-s0", "random-s0", "fixed-s1", "random-s1"):
        assert f"[start] {pair}: python -m graph.run --preset smoke" in proc.stderr
        assert (runs / pair / "final" / "eval.jsonl").is_file()
        assert (out / "verdicts" / pair / "final" / "eval.jsonl").read_bytes() == (
            runs / pair / "final" / "eval.jsonl").read_bytes()
    check_table_against_raw(out, runs, ["fixed", "random"], [0, 1], "fixed")
    # stage 0 trained once per seed: fixed (first in seed-major order) in full, random forked from it, so the
    # two engineers of a seed share stage 0's config and its validation verdicts byte for byte
    assert "refused --stage0-from" not in proc.stderr
    for s in (0, 1):
        start = {p: next(ln for ln in proc.stderr.splitlines() if ln.startswith(f"[start] {p}-s{s}:"))
                 for p in ("fixed", "random")}
        assert "--stage0-from" not in start["fixed"]
        assert start["random"].endswith(f"--stage0-from {runs / f'fixed-s{s}'}")
        for rel in ("stage_0/config.json", "stage_0/eval.jsonl"):
            assert (runs / f"fixed-s{s}" / rel).read_bytes() == (runs / f"random-s{s}" / rel).read_bytes(), (s, rel)
        donor = json.loads((runs / f"random-s{s}" / "stage0_from.json").read_text())["donor"]
        assert Path(donor).resolve() == (runs / f"fixed-s{s}").resolve()
        # each stage's kept weights are recorded by their sha256 beside the verdicts
        weights = {p: json.loads((out / "verdicts" / f"{p}-s{s}" / "weights.json").read_text()) for p in ("fixed", "random")}
        for p, recorded in weights.items():
            kept = sorted((runs / f"{p}-s{s}").glob("stage_*/checkpoint/*.safetensors"))
            assert kept and recorded == {
                f.parent.parent.name: {f.name: hashlib.sha256(f.read_bytes()).hexdigest()} for f in kept}
        # the donor keeps every stage's weights (the grid starts it with keep_checkpoints=all); the fork, on the
        # smoke preset's keep_checkpoints=last, deleted its links to stage 0's once its stage 1 was saved
        assert "stage_0" in weights["fixed"] and "stage_0" not in weights["random"], weights
        assert (runs / f"random-s{s}" / "stage_0" / "pruned.json").is_file()
        assert not (runs / f"fixed-s{s}" / "stage_0" / "pruned.json").exists()
    md = (out / "table.md").read_text()
    assert "| fixed | 2 |" in md and "| random | 2 |" in md and "Gap of Sum to `fixed`" in md
    for png in ("validation_per_stage.png", "allocation.png"):
        assert (out / png).stat().st_size > 1000
    assert "Stage 0 was trained once per seed and shared (paired design)" in md
    timings = json.loads((out / "timings.json").read_text())
    assert set(timings) == {"fixed-s0", "random-s0", "fixed-s1", "random-s1"}
    assert [timings[p]["stage0_shared"] for p in ("fixed-s0", "random-s0", "fixed-s1", "random-s1")] == [
        False, True, False, True]
    assert all(t["machine"] and t["last_rc"] == 0 for t in timings.values())

    # A rerun redoes nothing: no graph.run is started and the grid's run folders are untouched (the ablation
    # below may add its own run beside them meanwhile, on the other test worker).
    pairs = ("fixed-s0", "random-s0", "fixed-s1", "random-s1")
    before = {pair: snapshot(runs / pair) for pair in pairs}
    again = evals_cmd("evals.compare_engineers", cfg)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[start]" not in again.stderr
    for pair in ("fixed-s0", "random-s0", "fixed-s1", "random-s1"):
        assert f"[skip] {pair}: finished" in again.stderr
    assert {pair: snapshot(runs / pair) for pair in pairs} == before
    assert (out / "table.csv").read_text().count("\n") > 4


def test_ablate_context_smoke(compared):
    """V1 of the self-engineer next to the fixed baseline; the finished fixed run of the comparison is
    reused (same settings, same folder), so only the V1 run starts. One seed (1, not the default 0): the
    comparison above checks a table over two seeds already."""
    tmp, _, _ = compared
    proc = run_config("evals.ablate_context", tmp / "ablate.yaml",
                      "preset: smoke\nengineer: self\nvariants: [V1]\nbaselines: [fixed]\nbaseline: fixed\n"
                      f"seeds: [1]\nout: {tmp / 'ablate_out'}\nruns_dir: {tmp / 'runs'}\n")
    assert "[skip] fixed-s1: finished" in proc.stderr and "WARNING" not in proc.stderr
    assert "[start] V1-s1:" in proc.stderr and "--context V1" in proc.stderr
    # the V1 run forks stage 0 from the comparison's finished fixed run of its seed
    start = next(ln for ln in proc.stderr.splitlines() if ln.startswith("[start] V1-s1:"))
    assert start.endswith(f"--stage0-from {tmp / 'runs' / 'fixed-s1'}")
    settings = json.loads((tmp / "runs" / "V1-s1" / "settings.json").read_text())
    assert settings["context"] == "V1" and settings["engineer"] == "self" and settings["seed"] == 1
    check_table_against_raw(tmp / "ablate_out", tmp / "runs", ["V1", "fixed"], [1], "fixed")
    assert "| context | seeds |" in (tmp / "ablate_out" / "table.md").read_text()
