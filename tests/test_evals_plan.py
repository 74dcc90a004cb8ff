"""`--plan FILE`: a pre-registration git can confirm. bench_learning and the grid runners refuse, in one line, a
plan that is not committed or has uncommitted changes, or whose seeds are not the run's; the result records
the plan's commit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from evals import loop
from evals.config import LoopConfig
from evals.plan import PlanError, confirm, note

PLAN = "arm: fixed\nseeds: [0, 1]\nsuccess: mean valid rate above the base arm's, interval above 0\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.org")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "README").write_text("x\n")
    git(tmp_path, "add", "README")
    git(tmp_path, "commit", "-q", "-m", "start")
    return tmp_path


def test_a_plan_is_confirmed_only_as_committed(repo):
    plan = repo / "plans" / "p.yaml"
    plan.parent.mkdir()
    plan.write_text(PLAN)
    with pytest.raises(PlanError, match=r"--plan plans/p.yaml: not committed"):
        confirm(plan)
    git(repo, "add", "plans/p.yaml")
    with pytest.raises(PlanError, match="staged but never committed|uncommitted changes"):
        confirm(plan)
    git(repo, "commit", "-q", "-m", "plan")
    got = confirm(plan)
    assert got["commit"] == git(repo, "rev-parse", "HEAD") and got["seeds"] == [0, 1] and got["arm"] == "fixed"
    assert got["file"] == "plans/p.yaml" and got["commit"][:12] in note(got)
    plan.write_text(PLAN.replace("[0, 1]", "[0, 1, 2]"))
    with pytest.raises(PlanError, match="has uncommitted changes"):
        confirm(plan)


@pytest.mark.parametrize("text, says", [("arm: x\nseeds: [0]\n", "no success"),
                                        ("arm: x\nseeds: []\nsuccess: s\n", "seeds []"),
                                        ("arm: ''\nseeds: [1]\nsuccess: s\n", "arm ''"),
                                        ("- 1\n", "holds list")])
def test_a_bad_plan_is_named_in_one_line(repo, text, says):
    plan = repo / "bad.yaml"
    plan.write_text(text)
    with pytest.raises(PlanError) as e:
        confirm(plan)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_grid_refuses_a_plan_for_other_seeds_or_arms_and_records_a_good_one(repo):
    plan = repo / "p.yaml"
    plan.write_text(PLAN)
    git(repo, "add", "p.yaml")
    git(repo, "commit", "-q", "-m", "plan")
    cfg = LoopConfig(seeds=[0, 1], out=repo / "out")
    got = loop.confirm_plan(plan, cfg, ["fixed", "self"], tables_only=False)
    assert got["commit"] == git(repo, "rev-parse", "HEAD")
    with pytest.raises(PlanError, match=r"plans seeds \[0, 1\], the command would run \[0, 1, 2\]"):
        loop.confirm_plan(plan, LoopConfig(seeds=[0, 1, 2], out=repo / "out"), ["fixed"], tables_only=False)
    with pytest.raises(PlanError, match="arm 'fixed' is not in this grid"):
        loop.confirm_plan(plan, cfg, ["self"], tables_only=False)


def test_the_grid_command_line_refuses_an_uncommitted_plan_before_any_work(repo, tmp_path, capsys):
    from evals import compare_engineers

    plan = repo / "p.yaml"
    plan.write_text(PLAN)
    cfg = Path(__file__).resolve().parents[1] / "evals" / "configs" / "compare_smoke.yaml"
    out = tmp_path / "grid"
    assert compare_engineers.main(["--config", str(cfg), "--plan", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --plan p.yaml: not committed") and not out.exists()


def test_bench_learning_runs_the_plans_seeds_and_records_its_commit(repo, tmp_path, capsys, monkeypatch):
    from evals.bench import bench_learning

    plan = repo / "p.json"
    plan.write_text(json.dumps({"arm": "cpu-long", "seeds": [3, 4], "success": "gain >= +5 points"}))
    with pytest.raises(SystemExit):
        bench_learning.main(["--plan", str(plan)])
    assert "--plan p.json: not committed" in capsys.readouterr().err
    git(repo, "add", "p.json")
    git(repo, "commit", "-q", "-m", "plan")
    with pytest.raises(SystemExit):
        bench_learning.main(["--plan", str(plan), "--seeds", "0,1"])
    assert "plans seeds [3, 4], the command would run [0, 1]" in capsys.readouterr().err

    class Stop(Exception):
        pass

    seen = {}

    def stop(sizes, n, seed, *a, **k):  # the first thing a run does with its seeds: draw their instances
        seen.setdefault("seeds", []).append(seed)
        raise Stop

    monkeypatch.setattr(bench_learning, "training_draw", stop)
    with pytest.raises(Stop):
        bench_learning.main(["--plan", str(plan), "--quick"])
    assert seen["seeds"] == [3]


def test_a_grids_tables_quote_its_plan_and_its_commit(tmp_path):
    """The plan.json a planned grid wrote beside its tables is quoted in table.md and kept in table.json, by
    `--tables-only` too (it is a committed file of the folder)."""
    import shutil

    from evals import compare_engineers

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "compare_smoke"
    shutil.copytree(root / "evals" / "results" / "compare_smoke", out)
    planned = {"file": "plans/smoke.yaml", "arm": "all", "seeds": [0, 1], "success": "self above fixed",
               "commit": "0123456789abcdef0123456789abcdef01234567", "committed_at": "2026-01-02T03:04:05+00:00"}
    (out / loop.PLAN_FILE).write_text(json.dumps(planned))
    cfg = root / "evals" / "configs" / "compare_smoke.yaml"
    assert compare_engineers.main(["--config", str(cfg), "--tables-only", "--out", str(out)]) == 0
    assert "Planned in `plans/smoke.yaml` at commit 0123456789ab (2026-01-02T03:04:05+00:00)" in (out / "table.md").read_text()
    assert json.loads((out / "table.json").read_text())["plan"]["commit"] == planned["commit"]
