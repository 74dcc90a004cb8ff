"""The smoke comparison grid that the slow end-to-end tests share (the ``smoke_grid`` fixture in conftest).

One real `python -m evals.compare_engineers` run on the smoke preset, engineers `fixed` and `random`, seeds 0
and 1, stage 0 shared per seed. Its finished `fixed-s0` / `fixed-s1` runs are also the stage-0 donors
(`graph.run --stage0-from`) of the fork, approve and SIGKILL tests, so stage 0 is trained twice in the
suite for these five tests instead of five times; and they are the golden runs (tests/test_golden.py), pinned
without a training of their own.

SMOKE_SET holds the overrides that a fork must share with its donor (graph.stage0.MAY_DIFFER lists what may
differ): every loop test that forks from the grid passes exactly these, so the donor check accepts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What stage 0 generates, trains and evaluates: equal for the grid and for every fork of it.
SMOKE_SET = {"eval_limit": 4, "final_limit": 6, "eval_max_tokens": 16, "train.max_steps": 1}
# One engineer attempt of at most 16 tokens (asked again once at 64 when cut): the in-process 135M engineer has
# no JSON-schema decoding and rarely fits a config in its token limit; its retries and long replies (about a minute
# each on 2 cores) test nothing that tests/test_nodes_* do not.
ENGINEER_SET = {"engineer_max_attempts": 1, "engineer_max_tokens": 16}
# The configs' `set:` line (the same overrides for every run of a grid, as a user would write them).
SHRINK = "set: {" + ", ".join(f"{k}: {v}" for k, v in {**SMOKE_SET, **ENGINEER_SET}.items()) + "}\n"


def set_args(**extra) -> list[str]:
    """`--set key=value` flags for graph.run: SMOKE_SET plus `extra` (dots spelled `__`)."""
    pairs = {**SMOKE_SET, **{k.replace("__", "."): v for k, v in extra.items()}}
    return [a for k, v in pairs.items() for a in ("--set", f"{k}={v}")]


def evals_cmd(module: str, config: Path, *extra: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    """`python -m <module> --config <config>`, no API keys, the self-engineer in-process."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "ENGINEER_SERVING": "transformers"})
    return subprocess.run([sys.executable, "-m", module, "--config", str(config), *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_config(module: str, cfg: Path, body: str) -> subprocess.CompletedProcess:
    """Write an eval config (its command line first, SHRINK last) and run it; it must exit 0."""
    cfg.write_text(f"# python -m {module} --config {cfg}\n{body}{SHRINK}")
    proc = evals_cmd(module, cfg)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def shared_grid(root: Path) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The grid in `root`/compare, run once for every worker of a parallel test session (pytest-xdist): the first
    worker that asks runs it under a file lock, the others wait for it and read what it left (`done.json`)."""
    import json

    from filelock import FileLock

    tmp, done = root / "compare", root / "compare.done.json"
    with FileLock(str(root / "compare.lock")):
        if not done.is_file():
            tmp.mkdir(exist_ok=True)
            _, cfg, proc = run_grid(tmp)
            done.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                                        "stderr": proc.stderr}))
    d = json.loads(done.read_text())
    return tmp, tmp / "compare.yaml", subprocess.CompletedProcess(d["args"], d["returncode"], d["stdout"], d["stderr"])


def run_grid(tmp: Path, engineers: str = "fixed, random") -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The grid in `tmp` (its runs in tmp/runs); `engineers="fixed"` runs the golden runs alone (tests/support/golden.py)."""
    cfg = tmp / "compare.yaml"
    proc = run_config("evals.compare_engineers", cfg,
                      f"preset: smoke\nengineers: [{engineers}]\nseeds: [0, 1]\nbaseline: fixed\nshare_stage0: true\n"
                      f"out: {tmp / 'out'}\nruns_dir: {tmp / 'runs'}\n")
    return tmp, cfg, proc
