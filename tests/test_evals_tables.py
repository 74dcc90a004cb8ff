"""evals/: statistics, tables, resume and skip rules on hand-made run folders (fast; no model, no loop).

The end-to-end runs of the three scripts on the real loop are in test_evals_e2e.py.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from evals import compare_engineers, grid, pairs, results, stats, tables
from tests.support.run_folder import snapshot

# --------------------------------------------------------------------------- statistics


def test_t_quantiles_and_interval():
    assert stats.t975(1) == pytest.approx(12.7062)
    assert stats.t975(2) == pytest.approx(4.3027)
    # beyond the table the expansion is within 1e-3 of the exact quantiles (t_{.975,40}=2.0211, 120: 1.9799)
    assert stats.t975(40) == pytest.approx(2.0211, abs=1e-3)
    assert stats.t975(120) == pytest.approx(1.9799, abs=1e-3)
    r = stats.mean_ci([0.2, 0.4, 0.6])
    # mean 0.4, sd 0.2, half = 4.3027 * 0.2 / sqrt(3)
    assert r["mean"] == pytest.approx(0.4) and r["half"] == pytest.approx(4.3027 * 0.2 / math.sqrt(3))
    assert stats.mean_ci([0.5])["half"] is None  # one seed: no interval, never a fake one
    lo, hi = stats.wilson(5, 10)
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
    from graph.settings import build_settings

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
        (d / "validation.json").write_text(json.dumps({"stage": k, "decisions": [{"attempt": 1, "decision": "accepted"}]}))
        (d / "engineer_reply.md").write_text(f"# attempt 1 (stage {k}, engineer {engineer})\n\n{json.dumps({'sizes': sizes})}\n")
        (d / "checkpoint").mkdir()  # stand-in weights: only their bytes matter (hashed into weights.json)
        (d / "checkpoint" / "model.safetensors").write_bytes(f"weights of seed {seed}, stage {k}, {arm_bonus}".encode())


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
    monkeypatch.setattr(grid, "_run_child", no_graph_run)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    for pair in ("self-s0", "self-s1", "self-s2", "fixed-s0", "fixed-s1", "fixed-s2"):
        assert f"[skip] {pair}: finished" in err
    assert snapshot(tmp / "runs") == before  # nothing in the run folders was touched
    events = (tmp / "out" / "events.log").read_text()
    assert "[start]" not in events and events.count("[skip]") == 6
    assert "WARNING" not in err  # the saved settings are what this config would start

    # Recompute every table cell from the raw verdict files, independently of evals.stats.
    table = {(r["arm"], r["subset"], r["metric"]): r for r in csv.DictReader(open(tmp / "out" / "table.csv"))
             if r["layout"] == "pooled"}
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
                assert 0 <= float(row["ci95_low"]) <= float(row["mean"]) <= float(row["ci95_high"]) <= 1
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
    assert "| self | 3 |" in md and "Gap of Sum to `fixed`" in md and "Pooled gap to `fixed`" in md
    assert f"python -m evals.compare_engineers --config {cfg}" in md
    for png in ("validation_per_stage.png", "allocation.png"):
        assert (tmp / "out" / png).stat().st_size > 1000
    # the verdict files were copied next to the table, and --tables-only rebuilds the same numbers from them
    assert (tmp / "out" / "verdicts" / "self-s1" / "final" / "eval.jsonl").is_file()
    assert not list((tmp / "out" / "verdicts").rglob("checkpoint"))
    # each stage's weights are named by their sha256, as sha256sum prints it
    weights = json.loads((tmp / "out" / "verdicts" / "self-s1" / "weights.json").read_text())
    ck = tmp / "runs" / "self-s1" / "stage_1" / "checkpoint" / "model.safetensors"
    assert list(weights) == ["stage_0", "stage_1"]
    assert weights["stage_1"] == {"model.safetensors": hashlib.sha256(ck.read_bytes()).hexdigest()}
    assert "Identical weights" not in md  # every pair here trained its own weights
    # what the engineer proposed and what validation did with it are kept beside each stage's verdicts
    for rel in ("stage_1/validation.json", "stage_1/engineer_reply.md", "stage_0/config.json"):
        assert (tmp / "out" / "verdicts" / "self-s1" / rel).read_bytes() == (tmp / "runs" / "self-s1" / rel).read_bytes()
    first = (tmp / "out" / "table.csv").read_text()
    assert compare_engineers.main(["--config", str(cfg), "--tables-only"]) == 0
    assert (tmp / "out" / "table.csv").read_text() == first


def test_missing_key_is_a_visible_skip(finished_grid, monkeypatch, capsys):
    tmp = finished_grid
    for var in ("OPENAI_API_KEY", "GEMINI_API_KEY", "ENGINEER_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    cfg = write_config(tmp / "compare.yaml", tmp, ["fixed", "openai", "gemini"], [0, 1])
    monkeypatch.setattr(grid, "_run_child", no_graph_run)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    for eng in ("openai", "gemini"):
        line = next(line for line in err.splitlines() if line.startswith(f"[skip] engineer {eng}:"))
        assert "key" in line.lower()
    md = (tmp / "out" / "table.md").read_text()
    assert "`openai` skipped:" in md and "`gemini` skipped:" in md  # also noted under the table
    assert json.loads((tmp / "out" / "table.json").read_text())["skipped"].keys() == {"openai", "gemini"}


def test_dry_run_plans_without_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grid, "_run_child", no_graph_run)
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
    monkeypatch.setattr(grid, "_run_child", no_graph_run)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    first = (tmp / "out" / "table.csv").read_text()
    shutil.rmtree(tmp / "runs")
    shutil.rmtree(tmp / "out" / "verdicts" / "self-s2")  # this pair was never committed: it must run
    started = []

    def fake_child(cmd, log_path, name, timeout_s, env):
        started.append(name)
        return 1, 0.0

    monkeypatch.setattr(grid, "_run_child", fake_child)
    capsys.readouterr()
    assert compare_engineers.main(["--config", str(cfg)]) == 1  # self-s2 did not finish
    err = capsys.readouterr().err
    for pair in ("self-s0", "self-s1", "fixed-s0", "fixed-s1", "fixed-s2"):
        assert f"[skip] {pair}: finished earlier, verdicts kept in" in err
    assert started == ["self-s2"]
    table = (tmp / "out" / "table.csv").read_text()
    assert table != first and "fixed" in table  # rebuilt from the five kept pairs


# --------------------------------------------------------------------------- stage-0 sharing


def run_dir_of(cmd: list[str]) -> Path:
    return Path(cmd[cmd.index("--resume") + 1] if "--resume" in cmd else cmd[cmd.index("--run-dir") + 1])


class FakeGraphRun:
    """Stands in for `grid._run_child`: records each command and makes the run folder a real graph.run
    would leave (finished, or stopped after stage 0's training when `fail_stage0` names the pair)."""

    def __init__(self, fail_stage0: tuple[str, ...] = (), refuse_fork: bool = False):
        self.calls: list[tuple[str, list[str]]] = []
        self.envs: dict[str, dict[str, str]] = {}
        self.fail_stage0 = fail_stage0
        self.refuse_fork = refuse_fork

    def __call__(self, cmd, log_path, name, timeout_s, env):
        self.calls.append((name, list(cmd)))
        self.envs[name] = dict(env)
        if self.refuse_fork and "--stage0-from" in cmd:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text("graph.run: error: unrecognized arguments: --stage0-from\n")
            return 2, 0.1
        run_dir = run_dir_of(cmd)
        engineer, seed = name.rpartition("-s")[0], int(name.rpartition("-s")[2])
        if name in self.fail_stage0:  # stopped in stage 0: settings.json and stage 0's data, no verdicts
            from graph.settings import build_settings

            (run_dir / "stage_0").mkdir(parents=True)
            build_settings({"preset": "smoke", "engineer": engineer, "seed": str(seed), "run_dir": str(run_dir)},
                           {}).save(run_dir / "settings.json")
            (run_dir / "stage_0" / "config.json").write_text("{}")
            return 1, 2.0
        if "--resume" in cmd:
            import shutil

            shutil.rmtree(run_dir)
        make_finished_run(run_dir, seed, 0.2 if engineer == "self" else 0.0, engineer)
        if "--stage0-from" in cmd:
            (run_dir / "stage0_from.json").write_text(json.dumps({"donor": cmd[cmd.index("--stage0-from") + 1]}))
        return 0, 3.0

    def commands(self) -> dict[str, list[str]]:
        return dict(self.calls)


def test_stage0_is_shared_from_the_first_pair_of_each_seed(tmp_path, monkeypatch, capsys):
    fake = FakeGraphRun()
    monkeypatch.setattr(grid, "_run_child", fake)
    monkeypatch.setattr(grid, "machine", lambda: "RUN-MACHINE, 2 cores")
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0, 1])

    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert fake.calls == []
    runs = tmp_path / "runs"
    for s in (0, 1):
        assert f"[plan] fixed-s{s}: run in full (stage-0 donor of seed {s})" in err
        plan = next(ln for ln in err.splitlines() if ln.startswith(f"[plan] self-s{s}:"))
        assert f"stage 0 from fixed-s{s} once it has finished stage 0 (adds --stage0-from {runs / f'fixed-s{s}'})" in plan
    assert not runs.exists()

    assert compare_engineers.main(["--config", str(cfg)]) == 0
    cmds = fake.commands()
    assert [n for n, _ in fake.calls] == ["fixed-s0", "self-s0", "fixed-s1", "self-s1"]  # seed-major
    for s in (0, 1):
        assert "--stage0-from" not in cmds[f"fixed-s{s}"]
        cmd = cmds[f"self-s{s}"]
        assert cmd[cmd.index("--stage0-from") + 1] == str(runs / f"fixed-s{s}")
        assert cmd[cmd.index("--run-dir") + 1] == str(runs / f"self-s{s}")
        assert cmd[cmd.index("--engineer") + 1] == "self" and cmd[cmd.index("--seed") + 1] == str(s)
    timings = json.loads((tmp_path / "out" / "timings.json").read_text())
    assert timings["fixed-s1"]["stage0_shared"] is False and timings["fixed-s1"]["stage0_from"] is None
    assert timings["self-s1"]["stage0_shared"] is True and timings["self-s1"]["stage0_from"] == str(runs / "fixed-s1")
    assert all(t["machine"] == "RUN-MACHINE, 2 cores" for t in timings.values())
    # the donor is kept with the verdicts, so the note is rebuilt from them alone
    assert (tmp_path / "out" / "verdicts" / "self-s0" / "stage0_from.json").is_file()
    md = (tmp_path / "out" / "table.md").read_text()
    assert "Stage 0 was trained once per seed and shared (paired design)" in md
    assert "self-s0 from fixed-s0" in md and "self-s1 from fixed-s1" in md


def test_no_stage0_sharing_when_off_or_without_a_finished_donor(tmp_path, monkeypatch):
    # off: every pair runs in full
    fake = FakeGraphRun()
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0, 1])
    cfg.write_text(cfg.read_text() + "share_stage0: false\n")
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    assert len(fake.calls) == 4 and not any("--stage0-from" in c for _, c in fake.calls)
    assert "Stage 0 was trained once" not in (tmp_path / "out" / "table.md").read_text()

    # on, but fixed-s0 stops inside stage 0: self-s0 has no donor and runs in full; seed 1 still shares
    tmp = tmp_path / "b"
    fake = FakeGraphRun(fail_stage0=("fixed-s0",))
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "b.yaml", tmp, ["fixed", "self"], [0, 1])
    assert compare_engineers.main(["--config", str(cfg)]) == 1
    cmds = fake.commands()
    assert "--stage0-from" not in cmds["self-s0"]
    assert cmds["self-s1"][cmds["self-s1"].index("--stage0-from") + 1] == str(tmp / "runs" / "fixed-s1")

    # a donor folder with stage 0's verdicts but nothing after them (stopped inside evaluate) is no donor
    (tmp / "runs" / "fixed-s0" / "stage_0" / "eval.jsonl").write_text('{"id": "v0", "valid": true}\n')
    assert not pairs.stage0_finished(tmp / "runs" / "fixed-s0")
    (tmp / "runs" / "fixed-s0" / "stage_0" / "summary.md").write_text("evidence\n")
    assert pairs.stage0_finished(tmp / "runs" / "fixed-s0")


def test_stage0_donor_must_match_stage0_settings_and_can_be_any_engineer(tmp_path, monkeypatch, capsys):
    from graph.settings import build_settings

    runs = tmp_path / "runs"
    # a finished run of seed 0 outside the grid (another engineer) is a donor; one with other training is not
    make_finished_run(runs / "base-s0", 0, 0.0, "base")
    make_finished_run(runs / "learnability-s1", 1, 0.0, "learnability")
    build_settings({"preset": "smoke", "engineer": "learnability", "seed": "1", "run_dir": str(runs / "learnability-s1"),
                    "train.max_steps": "7"}, {}).save(runs / "learnability-s1" / "settings.json")
    fake = FakeGraphRun()
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0, 1])
    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"[plan] fixed-s0: run, stage 0 from {runs / 'base-s0'}:" in err
    assert "[plan] fixed-s1: run in full (stage-0 donor of seed 1)" in err
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    cmds = fake.commands()
    for name in ("fixed-s0", "self-s0"):
        assert cmds[name][cmds[name].index("--stage0-from") + 1] == str(runs / "base-s0")
    assert "--stage0-from" not in cmds["fixed-s1"]
    assert cmds["self-s1"][cmds["self-s1"].index("--stage0-from") + 1] == str(runs / "fixed-s1")


def test_refused_stage0_fork_falls_back_to_a_full_run(tmp_path, monkeypatch, capsys):
    """graph.run exits 2 for a refused donor (or, before it has the flag, for an unknown one): the pair then
    runs in full, visibly, instead of failing."""
    fake = FakeGraphRun(refuse_fork=True)
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0])
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    assert [n for n, _ in fake.calls] == ["fixed-s0", "self-s0", "self-s0"]
    assert "--stage0-from" in fake.calls[1][1] and "--stage0-from" not in fake.calls[2][1]
    err = capsys.readouterr().err
    assert "[warn] self-s0: graph.run refused --stage0-from" in err and "unrecognized arguments" in err
    t = json.loads((tmp_path / "out" / "timings.json").read_text())["self-s0"]
    assert t["stage0_shared"] is False and t["last_rc"] == 0
    # the full run that replaced the refused fork trains its own stage 0: it may be a donor, so it keeps all
    assert [kept_checkpoints(c) for _, c in fake.calls] == ["all", "last", "all"]


def kept_checkpoints(cmd: list[str]) -> str:
    """The keep_checkpoints of the settings graph.run builds from `cmd` (its own parser; no environment)."""
    from graph.run import _cli_values, _parser
    from graph.settings import build_settings

    assert cmd[1:3] == ["-m", "graph.run"], cmd
    return build_settings(_cli_values(_parser().parse_args(cmd[3:])), {}).keep_checkpoints


def test_a_run_that_trains_its_own_stage_0_keeps_every_checkpoint(tmp_path, monkeypatch, capsys):
    """The smoke preset keeps only the last stage's weights (keep_checkpoints=last), which would delete a donor's
    stage-0 weights once its stage 1 is evaluated, before the forks that start after it link them. With stage 0
    shared, the grid starts every run that trains its own stage 0 with keep_checkpoints=all, over the preset and
    over the config's own `set:`; a fork, and every run of a grid without sharing, keeps what it was given."""
    fake = FakeGraphRun()
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0, 1])
    cfg.write_text(cfg.read_text() + "set: {keep_checkpoints: last}\n")
    assert compare_engineers.main(["--config", str(cfg), "--dry-run"]) == 0
    plan = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[plan] fixed-s")]
    assert len(plan) == 2 and all(ln.endswith("--set keep_checkpoints=last --set keep_checkpoints=all") for ln in plan)
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    cmds = fake.commands()
    assert {n: kept_checkpoints(c) for n, c in cmds.items()} == {
        "fixed-s0": "all", "self-s0": "last", "fixed-s1": "all", "self-s1": "last"}
    assert all("--stage0-from" in cmds[f"self-s{s}"] for s in (0, 1))  # the two donors were forked from

    fake = FakeGraphRun()  # no sharing: no donor, and the preset's keep_checkpoints=last for every run
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "b.yaml", tmp_path / "b", ["fixed", "self"], [0])
    cfg.write_text(cfg.read_text() + "share_stage0: false\n")
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    assert [kept_checkpoints(c) for _, c in fake.calls] == ["last", "last"]


# --------------------------------------------------------------------------- audit gaps


def test_half_finished_pair_is_resumed_and_finished_ones_skipped(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    for name, seed in (("fixed-s0", 0), ("fixed-s1", 1)):
        make_finished_run(runs / name, seed, 0.0, "fixed")
    make_finished_run(runs / "self-s0", 0, 0.2, "self")
    import shutil

    shutil.rmtree(runs / "self-s0" / "final")  # settings.json and stage folders, no final/: half finished
    (runs / "self-s0" / "report.md").unlink()
    assert pairs.Pair(pairs.Arm("self", "self"), 0, runs / "self-s0").status() == "partial"
    fake = FakeGraphRun()
    monkeypatch.setattr(grid, "_run_child", fake)
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0, 1])
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert "[skip] fixed-s0: finished" in err and "[skip] fixed-s1: finished" in err
    assert [n for n, _ in fake.calls] == ["self-s0", "self-s1"]
    cmds = fake.commands()
    assert cmds["self-s0"][1:] == ["-m", "graph.run", "--resume", str(runs / "self-s0")]  # no fork on resume
    assert "--stage0-from" in cmds["self-s1"] and "--resume" not in cmds["self-s1"]
    assert len(results.verdict_folders(tmp_path / "out")) == 4


def test_wall_time_names_the_machine_that_ran_each_pair(tmp_path, monkeypatch):
    fake = FakeGraphRun()
    monkeypatch.setattr(grid, "_run_child", fake)
    monkeypatch.setattr(grid, "machine", lambda: "RUN-MACHINE, 2 cores")
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed", "self"], [0])
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    timings_path = tmp_path / "out" / "timings.json"
    timings = json.loads(timings_path.read_text())
    timings["old-pair-s0"] = {"wall_s": 5.0, "calls": 1, "last_rc": 0}  # written by older code: no machine
    timings_path.write_text(json.dumps(timings))
    monkeypatch.setattr(grid, "machine", lambda: "TABLE-MACHINE, 64 cores")
    assert compare_engineers.main(["--config", str(cfg), "--tables-only"]) == 0
    md = (tmp_path / "out" / "table.md").read_text()
    assert "Wall time per run on RUN-MACHINE, 2 cores: fixed-s0 3s, self-s0 3s." in md
    # the machine that rebuilds the tables goes nowhere in them: a rebuild elsewhere gives the same bytes
    table_json = (tmp_path / "out" / "table.json").read_text()
    assert "TABLE-MACHINE" not in md and "TABLE-MACHINE" not in table_json and "tables_built_on" not in table_json


def test_paper_columns_are_always_shown(tmp_path):
    """Verdicts with only 3 agents at wait 0.25: the 4/5-agent and wait 0.50/0.75 columns stay, empty."""
    folder = tmp_path / "verdicts" / "fixed-s0"
    (folder / "final").mkdir(parents=True)
    rows = [{"id": f"i{j}", "size": 3, "tags": {"agents": 3, "wait": 0.25}, "valid": j < 2, "optimal": j < 1}
            for j in range(4)]
    (folder / "final" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = stats.summarize({("fixed", 0): folder}, ["fixed"], None)
    assert table["subsets"] == ["agents_3", "agents_4", "agents_5", "wait_0.25", "wait_0.50", "wait_0.75",
                                "agents_3/wait_0.25", "all"]
    md = tables.table_markdown(table, title="t", command=None)
    header = next(ln for ln in md.splitlines() if ln.startswith("| engineer | seeds | 3 agents"))
    assert header == "| engineer | seeds | 3 agents | 4 agents | 5 agents | all |"
    # one seed, one cell: the Wilson interval of 2 of 4 and 1 of 4
    assert "| fixed | 1 | 50.0 [15.0, 85.0] / 25.0 [4.6, 69.9] | – / – | – / – | 50.0 [15.0, 85.0] / 25.0 [4.6, 69.9] |" in md
    assert "| engineer | seeds | wait 0.25 | wait 0.50 | wait 0.75 |" in md
    assert "| fixed | 1 | 50.0 [15.0, 85.0] / 25.0 [4.6, 69.9] | – / – | – / – |" in md
    assert "*4 agents*: no benchmark instances." in md
    assert "4 agents: n=0" in md and "wait 0.75: n=0" in md
    assert "No benchmark instances (n=0, shown as –) in: 4 agents, 5 agents, wait 0.50, wait 0.75." in md
    csv_rows = {(r["subset"], r["metric"]): r for r in tables.table_rows(table) if r["layout"] == "pooled"}
    assert csv_rows[("agents_5", "valid")]["n_seeds"] == 0 and csv_rows[("agents_5", "valid")]["mean"] is None


def test_custom_endpoint_gets_its_own_key_and_never_writes_it(tmp_path, monkeypatch, capsys):
    secret = "sk-test-Zq81-never-written"
    for var in ("ENGINEER_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "EVALS_TEST_UNSET_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EVALS_TEST_KIMI_KEY", secret)
    real_child = grid._run_child
    envs = {}

    def child(cmd, log_path, name, timeout_s, env):
        # the real runner (its log, its echo) on a stand-in command that only reports whether it got a key
        envs[name] = dict(env)
        script = "import os; k = os.environ.get('ENGINEER_API_KEY', ''); print('[child] key length', len(k))"
        rc, wall = real_child([sys.executable, "-c", script], log_path, name, timeout_s, env)
        label, _, seed = name.rpartition("-s")
        make_finished_run(run_dir_of(cmd), int(seed), 0.0, label)
        return rc, wall

    monkeypatch.setattr(grid, "_run_child", child)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"# python -m evals.compare_engineers --config {cfg}\npreset: smoke\nseeds: [0]\nbaseline: fixed\n"
        f"out: {tmp_path / 'out'}\nruns_dir: {tmp_path / 'runs'}\nengineers:\n  - fixed\n"
        "  - {name: kimi, base_url: 'http://127.0.0.1:9/v1', model: k2, api_key_env: EVALS_TEST_KIMI_KEY}\n"
        "  - {name: other, base_url: 'http://127.0.0.1:9/v1', model: m, api_key_env: EVALS_TEST_UNSET_KEY}\n"
    )
    assert compare_engineers.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert "[skip] engineer other: engineer 'other' needs an API key: set EVALS_TEST_UNSET_KEY" in err
    assert envs["kimi-s0"]["ENGINEER_API_KEY"] == secret  # mapped for that child only
    assert "ENGINEER_API_KEY" not in envs["fixed-s0"]
    assert "key length 26" in (tmp_path / "out" / "logs" / "kimi-s0.log").read_text()
    assert "key length 0" in (tmp_path / "out" / "logs" / "fixed-s0.log").read_text()
    assert secret not in err
    for folder in (tmp_path / "out", tmp_path / "runs"):
        for p in folder.rglob("*"):
            assert not p.is_file() or secret.encode() not in p.read_bytes(), p
    assert "`other` skipped: engineer 'other' needs an API key: set EVALS_TEST_UNSET_KEY" in (
        tmp_path / "out" / "table.md").read_text()


def test_stage0_settings_that_must_match_a_donor(tmp_path):
    """Mirrors graph.run --stage0-from: only engineer, context and run-folder settings may differ."""
    for key in ("seed", "preset", "stages", "policy_model", "train.max_steps", "eval_limit", "final_limit"):
        assert pairs.stage0_setting(key), key
    for key in ("engineer", "engineer_model", "context", "evidence_chars", "run_dir", "approve"):
        assert not pairs.stage0_setting(key), key
    make_finished_run(tmp_path / "fixed-s0", 0, 0.0, "fixed")
    pair = pairs.Pair(pairs.Arm("V1", "self", context="V1"), 0, tmp_path / "V1-s0")
    assert pairs.find_donor(pair, [tmp_path / "fixed-s0"], "smoke", {}, {}) == tmp_path / "fixed-s0"
    assert pairs.find_donor(pair, [tmp_path / "fixed-s0"], "smoke", {"final_limit": 3}, {}) is None
    assert pairs.find_donor(pair, [tmp_path / "fixed-s0"], "smoke", {"stages": 1}, {}) is None  # nothing to share
    # a run on keep_checkpoints=last (a fork of the grid, or a run without sharing) deleted stage 0's weights
    # once stage 1's were saved: graph.run --stage0-from would refuse it, so the next candidate is the donor
    make_finished_run(tmp_path / "self-s0", 0, 0.0, "self")
    (tmp_path / "self-s0" / "stage_0" / "pruned.json").write_text('{"deleted": ["model.safetensors"]}\n')
    (tmp_path / "self-s0" / "stage_0" / "checkpoint" / "model.safetensors").unlink()
    assert not pairs.stage0_weights_kept(tmp_path / "self-s0") and pairs.stage0_weights_kept(tmp_path / "fixed-s0")
    both = [tmp_path / "self-s0", tmp_path / "fixed-s0"]
    assert pairs.find_donor(pair, both, "smoke", {}, {}) == tmp_path / "fixed-s0"
    assert pairs.find_donor(pair, both[:1], "smoke", {}, {}) is None


def test_failure_shares_and_identical_answers_from_raw_verdicts(tmp_path):
    """The 'where the answers fail' table counts first failing checks from the raw rows, and arms of a seed
    whose final answers are the same answer for answer are named in a note (and only those)."""
    pattern = {  # (arm, seed) -> first failing check of each of its 6 answers (None: valid)
        ("a", 0): ["parse_error", "agent_count", "agent_count", None, "conflict", "agent_count"],
        ("a", 1): ["agent_count", "agent_count", "agent_count", "agent_count", "parse_error", "parse_error"],
        ("b", 0): ["conflict", "conflict", None, None, "agent_count", "parse_error"],
        ("b", 1): ["conflict", "conflict", "conflict", None, "agent_count", "agent_count"],
        ("c", 0): ["parse_error", "agent_count", "agent_count", None, "conflict", "agent_count"],  # = a-s0
    }
    verdicts = {}
    for (arm, seed), fails in pattern.items():
        folder = tmp_path / f"{arm}-s{seed}"
        (folder / "final").mkdir(parents=True)
        with open(folder / "final" / "eval.jsonl", "w") as f:
            for j, kind in enumerate(fails):
                f.write(json.dumps({"id": f"i{j}", "tags": {"agents": 3, "wait": 0.25}, "text": f"{kind} {j}",
                                    "valid": kind is None, "optimal": False, "failure": kind}) + "\n")
        verdicts[(arm, seed)] = folder

    table = stats.summarize(verdicts, ["a", "b", "c"], "a")
    fails = table["failures"]
    # valid first, then the checker's order (parse_error < agent_count < conflict), only kinds that occur
    assert fails["kinds"] == ["valid", "parse_error", "agent_count", "conflict"]
    for arm in ("a", "b"):
        for kind in fails["kinds"]:
            shares = [sum(k == (None if kind == "valid" else kind) for k in pattern[(arm, s)]) / 6 for s in (0, 1)]
            st = fails["rows"][arm][kind]
            assert st["mean"] == pytest.approx(statistics.fmean(shares)), (arm, kind)
            assert 0 <= st["low"] <= st["mean"] <= st["high"] <= 1, (arm, kind)
    c_count = fails["rows"]["c"]["agent_count"]
    assert c_count["mean"] == pytest.approx(3 / 6) and c_count["method"] == "wilson"  # one seed: 3 of 6
    assert (c_count["low"], c_count["high"]) == pytest.approx(stats.wilson(3, 6))

    md = tables.table_markdown(table, title="t", command=None)
    # b, seed means: valid (2/6 + 1/6) / 2 = 25.0 %, conflict (2/6 + 3/6) / 2 = 41.7 %
    section = md.split("**Where the answers fail")[1]
    assert "| engineer | seeds | `valid` | `parse_error` | `agent_count` | `conflict` |" in section
    b_row = next(ln for ln in section.splitlines() if ln.startswith("| b | 2 |"))
    assert b_row.split("|")[3].strip().startswith("25.0 [") and b_row.split("|")[6].strip().startswith("41.7 [")
    tables.write_tables(table, tmp_path / "out", title="t", command=None)
    rows = list(csv.DictReader(open(tmp_path / "out" / "failures.csv")))
    assert len(rows) == 3 * 4 and {(r["arm"], r["failure"]) for r in rows} >= {("b", "conflict"), ("c", "valid")}

    notes = stats.identical_answer_notes(verdicts)
    assert len(notes) == 1 and notes[0].startswith("Identical answers, seed 0: a, c gave the same 6 final")
    # one answer's text differs: no longer identical
    rows_c = (verdicts[("c", 0)] / "final" / "eval.jsonl").read_text().replace('"text": "None 3"', '"text": "x"')
    (verdicts[("c", 0)] / "final" / "eval.jsonl").write_text(rows_c)
    assert stats.identical_answer_notes(verdicts) == []


# --------------------------------------------------------------------------- stopping a grid


CHILD = """
import pathlib, signal, sys, time
def stop(signum, frame):
    pathlib.Path(sys.argv[1], "terminated").write_text(signal.Signals(signum).name)
    sys.exit(130)  # as graph.run does
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1], "started").write_text("")
time.sleep(60)
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_to_the_grid_stops_its_runs_and_starts_no_more(tmp_path, monkeypatch, capsys, jobs):
    """A grid in the background ignores SIGINT: SIGTERM must stop it as Ctrl-C does. Its graph.run (a real
    child process that exits 130 on SIGTERM, as graph.run does) is terminated, not orphaned, and no further
    pair is started."""
    import os
    import signal
    import sys
    import threading

    started: list[str] = []
    real = grid._run_child

    def child(cmd, log_path, name, timeout_s, env, **kw):
        started.append(name)
        (tmp_path / name).mkdir()
        return real([sys.executable, "-c", CHILD, str(tmp_path / name)], log_path, name, timeout_s, env)

    def kill_when_started():
        for _ in range(600):
            if (tmp_path / "fixed-s0" / "started").exists():
                os.kill(os.getpid(), signal.SIGTERM)
                return
            threading.Event().wait(0.05)

    monkeypatch.setattr(grid, "_run_child", child)
    monkeypatch.setattr(grid, "jobs_cores", lambda n: None if n == 1 else [[0], [0]])
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed"], [0, 1, 2] if jobs == 2 else [0, 1])
    killer = threading.Thread(target=kill_when_started)
    killer.start()
    before = signal.getsignal(signal.SIGTERM)
    assert compare_engineers.main(["--config", str(cfg), "--jobs", str(jobs)]) == 130
    killer.join()
    assert signal.getsignal(signal.SIGTERM) == before  # the grid's handler is gone with the grid
    assert "fixed-s2" not in started and ("fixed-s1" not in started if jobs == 1 else True)
    assert (tmp_path / "fixed-s0" / "started").exists()
    for name in started:  # every run in flight got the SIGTERM and exited; none started after it
        if (tmp_path / name / "started").exists():
            assert (tmp_path / name / "terminated").read_text() == "SIGTERM"
    assert "interrupted; rerun the same command to resume" in capsys.readouterr().err


def test_a_run_stopped_by_a_signal_stops_the_grid(tmp_path, monkeypatch, capsys):
    """graph.run exits 130 when somebody stopped it: the grid does not step over it to the next pair."""
    started: list[str] = []

    def child(cmd, log_path, name, timeout_s, env, **kw):
        started.append(name)
        return 130, 1.0

    monkeypatch.setattr(grid, "_run_child", child)
    cfg = write_config(tmp_path / "c.yaml", tmp_path, ["fixed"], [0, 1])
    assert compare_engineers.main(["--config", str(cfg)]) == 130
    assert started == ["fixed-s0"]
    err = capsys.readouterr().err
    assert "[fail] fixed-s0: graph.run exited with 130" in err and "[stop] a graph.run was interrupted" in err
    # the log it points to: repository-relative inside the checkout (so a committed events.log names no
    # worktree), the full path outside it, as here
    assert f"see {tmp_path / 'out' / 'logs' / 'fixed-s0.log'};" in err


def test_no_graph_run_starts_once_the_grid_is_stopping(tmp_path):
    """A job thread that reaches its Popen after the grid began stopping its children must not start a run that
    nobody would stop (the grid would then wait for it to finish)."""
    import sys

    grid._stop_children()
    try:
        marker = tmp_path / "ran"
        rc, wall = grid._run_child([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path / "x.log", "x",
                                   None, {})
        assert (rc, marker.exists()) == (grid.EXIT_INTERRUPTED, False)
        assert "not started: the grid is stopping" in (tmp_path / "x.log").read_text()
    finally:
        grid._STOPPING.clear()
    rc, _ = grid._run_child([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path / "x.log", "x", None, {})
    assert rc == 0 and marker.exists()


def test_identical_weights_are_named_from_the_recorded_hashes(tmp_path):
    """Runs of one seed whose last checkpoints hash the same get one note; another seed's or an earlier stage's
    equality does not count, and a stage already hashed is not hashed again."""
    def run(name: str, seed: int, last: bytes, first: bytes = b"start") -> tuple[tuple[str, int], Path]:
        for k, data in enumerate((first, last)):
            (tmp_path / "runs" / name / f"stage_{k}" / "checkpoint").mkdir(parents=True)
            (tmp_path / "runs" / name / f"stage_{k}" / "checkpoint" / "model.safetensors").write_bytes(data)
        dest = tmp_path / "verdicts" / name
        grid.record_weights(tmp_path / "runs" / name, dest)
        return (name.split("-")[0], seed), dest

    verdicts = dict([run("a-s0", 0, b"same"), run("b-s0", 0, b"other"), run("c-s0", 0, b"same"),
                     run("a-s1", 1, b"same"), run("b-s1", 1, b"x1")])
    assert stats.identical_weight_notes(verdicts) == [
        "Identical weights, seed 0: a, c ended stage 1 with byte-identical checkpoints (sha256 in "
        "`verdicts/<pair>/weights.json`): they trained on the same data, so the gaps between their rows are the "
        "evaluation's own noise."]
    # recorded once: new bytes under an already-hashed stage are not re-read (a finished pair's weights never change)
    (tmp_path / "runs" / "b-s0" / "stage_1" / "checkpoint" / "model.safetensors").write_bytes(b"same")
    assert grid.record_weights(tmp_path / "runs" / "b-s0", tmp_path / "verdicts" / "b-s0")["stage_1"] == {
        "model.safetensors": hashlib.sha256(b"other").hexdigest()}
    # a run folder without checkpoints (its verdicts committed, its run folder gone) writes nothing
    (tmp_path / "runs" / "gone" / "stage_0").mkdir(parents=True)
    assert grid.record_weights(tmp_path / "runs" / "gone", tmp_path / "verdicts" / "gone") == {}
    assert not (tmp_path / "verdicts" / "gone").exists()
