"""A smoke loop on an RLVE-Gym task with RLVE's rule as the engineer, through the real CLI on the embedded model:
`python -m graph.run --task rlve:Multiplication:levels=3 --engineer rlve --approve` (the smoke preset, 2 stages of one GRPO step).
It is killed (SIGKILL) at the `--approve` prompt after stage 0, and `--resume` goes on: the person accepts, stage 1
trains on the rule's window, and the report, the final table and TensorBoard show the controller's levels. (That the
rule's level reached survives a resume and is asked with again is tests/test_rlve_rule.py's, with scripted rates:
here the last stage asks no engineer.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graph.approve import APPROVE_PROMPT
from tests.test_rg_loop import scalars

ROOT = Path(__file__).resolve().parent.parent
TASK = "rlve:Multiplication:levels=3"
LABELS = ("digit_num=2", "digit_num=3", "digit_num=4")

pytestmark = pytest.mark.slow


def test_an_rlve_task_runs_end_to_end_with_the_rlve_rule_and_resumes_with_its_memory(tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k not in ("VISUAL", "APPROVE")}
    env.update({"PRESET": "smoke", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    cmd = [sys.executable, "-m", "graph.run", "--task", TASK, "--engineer", "rlve", "--run-dir", str(run),
           "--set", 'start_config={"levels": {"0": 1.0}}', "--set", "train.max_steps=1", "--eval-limit", "3",
           "--final-limit", "3", "--approve"]
    first = tmp_path / "first.log"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=first.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 1500  # a loaded 2-core machine: about 15 minutes to the prompt
        while APPROVE_PROMPT not in first.read_text():
            assert proc.poll() is None, f"the run exited ({proc.returncode}):\n{first.read_text()[-3000:]}"
            assert time.monotonic() < end, "timed out waiting for the --approve prompt"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    resumed = subprocess.run([sys.executable, "-m", "graph.run", "--resume", str(run)], cwd=ROOT, env=env,
                             input="y\n", capture_output=True, text=True, timeout=1500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = first.read_text()

    # stage 0 trained on the controller's first level; the rule checked it and kept its level in its memory
    rows = [json.loads(x) for x in (run / "stage_0" / "train.jsonl").read_text().splitlines()]
    assert rows and {r["level"] for r in rows} == {0} and "digit_num" in rows[0]["parameter"]
    reply = (run / "stage_0" / "engineer_reply.md").read_text()
    assert "rlve: level 0" in reply and "rationale: rlve: level 0" in log
    table = log.split("Proposed config for stage 1", 1)[1].split(APPROVE_PROMPT, 1)[0]
    assert all(label in table for label in LABELS)  # --approve shows the controller's parameters per level
    m0 = json.loads((run / "stage_0" / "metrics.json").read_text())
    reached = 1 if m0["by_level"]["0"]["n"] >= 8 and m0["by_level"]["0"]["valid_rate"] >= 0.9 else 0
    stage1 = json.loads((run / "stage_1" / "config.json").read_text())["levels"]
    assert {int(k) for k in stage1} == set(range(reached + 1))
    assert '"rlve_reached": ' not in (run / "stage_0" / "engineer_prompt.md").read_text()  # asked with no memory
    assert "[stage 1] trained" in resumed.stderr  # the resumed process trained stage 1 on the rule's window

    # the report, the final table and TensorBoard show the task's levels and its failure labels
    report = (run / "report.md").read_text()
    assert all(label in report for label in LABELS)
    final = (run / "final" / "table.md").read_text()
    assert all(f"| {lv} | {label} |" in final for lv, label in enumerate(LABELS))
    tags = scalars(run / "tb")
    assert {f"eval/valid_rate/level_{lv}" for lv in range(3)} <= set(tags)
    assert {"eval/failure/wrong_format", "eval/failure/wrong"} <= set(tags)
