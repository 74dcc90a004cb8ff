"""A pre-registered plan that git can confirm: the arm, its seeds and its success rule, committed before the
results.

    # plans/cpu_long_g16.yaml
    arm: cpu-long, 1 prompt x 16 completions, dynamic sampling
    seeds: [0, 1, 2]
    success: mean gain of at least +5 points over the warm start, with its 95 % interval above 0

`python -m evals.bench.bench_learning --plan FILE ...` and the grid runners (`python -m evals.compare_engineers
--config C --plan FILE`, `evals.ablate_context`) refuse to start, in one line, when FILE is not committed or has
uncommitted changes, or when its seeds (or arm) are not the ones the command would run. The result records the
plan and the commit that last changed it (`plan` in bench_learning's JSON; `plan.json` beside a grid's tables,
quoted in its table.md), so a results README can say "planned at <commit>, before the results at <commit>",
and a reader checks it with `git log --format='%H %cI' -- FILE` and `git log -- <results file>`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

REQUIRED = ("arm", "seeds", "success")


class PlanError(ValueError):
    """A plan that cannot be used: one line naming the file, the bad value and what is allowed."""


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PlanError(f"git could not be run ({e.__class__.__name__}); a plan needs git to confirm its commit") from None


def read_plan(path: Path | str) -> dict[str, Any]:
    """The plan in `path` (YAML or JSON): {arm, seeds, success, ...}; PlanError when a field is missing or wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PlanError(f"--plan {path}: cannot be read ({e.__class__.__name__}); allowed: a YAML or JSON file") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse error is one line
        raise PlanError(f"--plan {path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} "
                        f"({e.__class__.__name__}); allowed: a mapping with {', '.join(REQUIRED)}") from None
    if not isinstance(data, dict):
        raise PlanError(f"--plan {path}: holds {type(data).__name__}; allowed: a mapping with {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise PlanError(f"--plan {path}: no {', '.join(missing)}; allowed: a mapping with {', '.join(REQUIRED)}")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds) or len(set(seeds)) != len(seeds):
        raise PlanError(f"--plan {path}: seeds {seeds!r}; allowed: a list of distinct integers, e.g. [0, 1, 2]")
    for k in ("arm", "success"):
        if not isinstance(data[k], str) or not data[k].strip():
            raise PlanError(f"--plan {path}: {k} {data[k]!r}; allowed: a non-empty text")
    return data


def confirm(path: Path | str) -> dict[str, Any]:
    """The plan in `path` with the commit git confirms: PlanError unless the file is tracked by git, has no
    uncommitted change (staged or not), and has a commit. Returns {file, arm, seeds, success, commit,
    committed_at, ...the plan's other fields}."""
    path = Path(path).resolve()
    plan = read_plan(path)
    where = path.parent
    top = _git(where, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise PlanError(f"--plan {path}: not inside a git repository; allowed: a plan committed to this repository")
    root = Path(top.stdout.strip())
    rel = path.relative_to(root.resolve()).as_posix()
    if _git(root, "ls-files", "--error-unmatch", "--", rel).returncode != 0:
        raise PlanError(f"--plan {rel}: not committed; allowed: a committed plan (git add {rel} && git commit), "
                        "so that git dates it before the results")
    if _git(root, "status", "--porcelain", "--", rel).stdout.strip():
        raise PlanError(f"--plan {rel}: has uncommitted changes; allowed: a plan exactly as committed (commit or "
                        "discard the changes)")
    log = _git(root, "log", "-1", "--format=%H %cI", "--", rel)
    if log.returncode != 0 or not log.stdout.strip():
        raise PlanError(f"--plan {rel}: staged but never committed; allowed: a committed plan (git commit)")
    commit, when = log.stdout.split()
    return {"file": rel, **{k: plan[k] for k in plan}, "commit": commit, "committed_at": when}


def check_seeds(plan: dict[str, Any], seeds: list[int]) -> None:
    """PlanError unless `seeds` are the plan's (as a set: the order a command runs them in is its own)."""
    if sorted(seeds) != sorted(plan["seeds"]):
        raise PlanError(f"--plan {plan['file']}: plans seeds {plan['seeds']}, the command would run {seeds}; allowed: "
                        "the plan's seeds (drop --seeds, or commit a new plan before running others)")


def note(plan: dict[str, Any]) -> str:
    """One line for a results table: what was planned, in which file, at which commit."""
    return (f"Planned in `{plan['file']}` at commit {plan['commit'][:12]} ({plan['committed_at']}): arm "
            f"{plan['arm']}, seeds {plan['seeds']}, success: {plan['success']}")
