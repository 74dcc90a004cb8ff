"""SIGTERM during SFT and during GRPO stops `python -m graph.run` at the next step, then it resumes
(issue 17): the real smoke preset with the embedded model, training lengthened so that a stage that did
not stop would run for minutes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
LONG = ["--set", "train.sft_steps=40", "--set", "train.max_steps=40", "--set", "eval_limit=2",
        "--set", "final_limit=2", "--set", "eval_max_tokens=16"]


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PRESET": "smoke", "ENGINEER": "fixed"})
    return subprocess.Popen([sys.executable, "-m", "graph.run", *args], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def sigterm_when(proc: subprocess.Popen, ready, what: str, timeout: float = 900) -> float:
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.5)
    time.sleep(2)  # a step or two into the trainer
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(180) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return time.monotonic() - t0


def test_sigterm_during_sft_and_during_grpo_stops_then_resumes(tmp_path):
    run_dir = tmp_path / "run"
    s0 = run_dir / "stage_0"
    proc = start(["--run-dir", str(run_dir), "--stages", "1", *LONG], tmp_path / "sft.log")
    took = sigterm_when(proc, lambda: any((s0 / "tb" / "sft").glob("events*")), "the SFT warm start")
    log = (tmp_path / "sft.log").read_text()
    assert "[stop] SIGTERM" in log and f"--resume {run_dir}" in log and "Traceback" not in log, log[-3000:]
    assert took < 120, f"SFT went on for {took:.0f}s after SIGTERM"
    assert not (s0 / "checkpoint").exists()

    proc = start(["--resume", str(run_dir)], tmp_path / "grpo.log")
    took = sigterm_when(proc, lambda: any((s0 / "tb").glob("events*")), "GRPO")
    log = (tmp_path / "grpo.log").read_text()
    assert "[stop] SIGTERM" in log and "Traceback" not in log, log[-3000:]
    assert took < 120, f"GRPO went on for {took:.0f}s after SIGTERM"
    assert not (s0 / "checkpoint").exists()

    done = start(["--resume", str(run_dir)], tmp_path / "resume.log")
    assert done.wait(1800) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert (run_dir / "report.md").is_file() and (s0 / "checkpoint").is_dir()
