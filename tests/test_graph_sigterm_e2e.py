"""SIGTERM during SFT, during GRPO and during the final evaluation stops `python -m graph.run` at the next step
or batch, then it resumes: the real smoke preset with the embedded model. The trainers' progress bars
(on stderr) say when each has started and how far it got: a stopped trainer never reaches its last step. A
stopped evaluation keeps the answers it has (`eval.partial.jsonl`) and the resumed one asks only the rest."""

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
SFT_STEPS, GRPO_STEPS = 6, 2  # each stop lands a step or two into its trainer (a GRPO step: 6 s or more)
LONG = ["--set", f"train.sft_steps={SFT_STEPS}", "--set", f"train.max_steps={GRPO_STEPS}", "--set", "eval_limit=2",
        "--set", "final_limit=12", "--set", "eval_batch_size=2", "--set", "eval_max_tokens=16"]


def private_cache(tmp_path: Path) -> Path:
    """A model cache of the test's own (the embedded model linked in), so that the SFT warm start is not
    a cached one from an earlier run (trainer.sft caches it under the model cache)."""
    from llm_backends.models import resolve_model

    model = resolve_model()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / model.name).symlink_to(model)
    return cache


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PRESET": "smoke", "ENGINEER": "fixed",
                "ENV_ENGINEER_CACHE": str(log.parent / "cache")})
    return subprocess.Popen([sys.executable, "-m", "graph.run", *args], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def sigterm_when(proc: subprocess.Popen, ready, what: str, timeout: float = 900, settle: float = 2) -> float:
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.5 if settle else 0.05)
    time.sleep(settle)  # into the trainer's first steps
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(600) == 130  # a GRPO step takes up to ~2 min on a busy 2-core machine
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return time.monotonic() - t0


def test_sigterm_during_sft_and_during_grpo_stops_then_resumes(tmp_path):
    run_dir = tmp_path / "run"
    s0 = run_dir / "stage_0"
    private_cache(tmp_path)
    proc = start(["--run-dir", str(run_dir), "--stages", "1", *LONG], tmp_path / "sft.log")
    took = sigterm_when(proc, lambda: "SFT warm start:" in (tmp_path / "sft.log").read_text(), "the SFT warm start")
    log = (tmp_path / "sft.log").read_text()
    assert "[stop] SIGTERM" in log and f"--resume {run_dir}" in log and "Traceback" not in log, log[-3000:]
    assert f"{SFT_STEPS}/{SFT_STEPS}" not in log and "GRPO stage_0:" not in log, f"SFT went on ({took:.0f}s)"
    assert not (s0 / "checkpoint").exists()

    proc = start(["--resume", str(run_dir)], tmp_path / "grpo.log")
    took = sigterm_when(proc, lambda: "GRPO stage_0:" in (tmp_path / "grpo.log").read_text(), "GRPO")
    log = (tmp_path / "grpo.log").read_text()
    assert "[stop] SIGTERM" in log and "Traceback" not in log, log[-3000:]
    assert f"{GRPO_STEPS}/{GRPO_STEPS}" not in log.split("GRPO stage_0:", 1)[1], f"GRPO went on ({took:.0f}s)"
    assert not (s0 / "checkpoint").exists()

    journal = run_dir / "final" / "eval.partial.jsonl"  # a header line, then one row per answer

    def answered() -> int:
        return len(journal.read_text().splitlines()) - 1 if journal.is_file() else 0

    proc = start(["--resume", str(run_dir)], tmp_path / "final.log")
    took = sigterm_when(proc, lambda: answered() >= 2, "the final evaluation's first batch", settle=0)
    log = (tmp_path / "final.log").read_text()
    assert "[stop] SIGTERM during final_evaluate" in log and "Traceback" not in log, log[-3000:]
    kept = answered()
    assert 2 <= kept < 12 and kept % 2 == 0, f"{kept} answers kept ({took:.0f}s)"  # whole batches of 2
    assert not (run_dir / "final" / "eval.jsonl").exists() and not (run_dir / "report.md").exists()

    done = start(["--resume", str(run_dir)], tmp_path / "resume.log")
    assert done.wait(1800) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    log = (tmp_path / "resume.log").read_text()
    assert f"{kept} of 12 answers kept from an earlier evaluation" in log, log[-3000:]
    assert (run_dir / "report.md").is_file() and (s0 / "checkpoint").is_dir()
    assert not journal.exists() and len((run_dir / "final" / "eval.jsonl").read_text().splitlines()) == 12
