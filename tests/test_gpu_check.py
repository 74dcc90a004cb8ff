"""The GPU check (`python -m evals.bench.gpu_check`) run on CPU, so that it never rots between GPU runs: with the
tiny random model and 2 steps it names every check, passes the ones a CPU can run and skips, with a reason, exactly
the CUDA-specific ones. The fast tests pin the paper's cost arithmetic and the report's shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evals.bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]

# skipped on CPU, each for a reason the JSON gives: they need CUDA, or a probe of the 4B shape, or the GPU's budget
CUDA_ONLY = {"cuda_training", "bf16_weights", "fused_lm_head_triton", "cuda_rng_state", "peak_memory", "paper_cost",
             "wall_time"}


def test_a_new_report_names_every_check_as_not_reached(tmp_path):
    report = gpu_check.Report(tmp_path / "r.json", "cpu", [])
    report.check("imports", True, "ok")
    report.skip("device", "a reason")
    report.write()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert list(doc["checks"]) == list(gpu_check.CHECKS)
    assert doc["summary"]["pass"] == ["imports"] and doc["summary"]["fail"] == []
    assert doc["checks"]["device"]["reason"] == "a reason"
    assert all(c["reason"].startswith("not reached") for n, c in doc["checks"].items() if n not in ("imports", "device"))


def test_paper_cost_counts_the_paper_stage():
    """1,000 steps of 64 completions; training scales with the tokens, generation with the longest answer."""
    probe = {"decode": {"prefill_s": 1.0, "seconds_per_token_step": 0.01},
             "train_micro_batch": {"sequences": 8, "prompt_tokens": 500, "answer_tokens": 1500, "seconds": 2.0}}
    cost = gpu_check.paper_cost(probe, prompt_tokens=500.0)
    assert cost["steps_per_stage"] == 1000 and cost["completions_per_step"] == 64
    a = cost["scenarios"]["answers_1000"]
    # 64 x 1,500 tokens at 2 s per 16,000: 12 s; generation 1 + 4,096 x 0.01 = 41.96 s
    assert a["training_s_per_step"] == 12.0 and a["generation_s_per_step_transformers"] == 42.0
    assert a["hours_per_stage_transformers_path"] == round(1000 * (12.0 + 41.96) / 3600, 1)
    assert a["step_s_with_readme_vllm_generation"] == [31.0, 52.0]  # 15-35 s generation + 4-5 s, as the README
    assert cost["scenarios"]["answers_2000"]["training_s_per_step"] == 20.0
    assert cost["readme_estimate"]["hours_per_stage"] == [8, 14]


@pytest.mark.slow
def test_the_gpu_check_runs_on_cpu_and_skips_only_what_needs_cuda(tmp_path, embedded_model_path):
    out = tmp_path / "cpu.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN__")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "evals.bench.gpu_check", "--device", "cpu", "--steps", "2",
                        "--out", str(out), "--work", str(tmp_path / "work")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    checks = doc["checks"]
    assert list(checks) == list(gpu_check.CHECKS)
    failed = {n: c.get("detail") for n, c in checks.items() if c["status"] == "fail"}
    assert not failed, (failed, r.stdout[-3000:])
    assert all(c["status"] in ("pass", "skipped") for c in checks.values())
    skipped = {n for n, c in checks.items() if c["status"] == "skipped"}
    assert skipped == CUDA_ONLY, skipped
    assert all(len(checks[n]["reason"]) > 10 and "not reached" not in checks[n]["reason"] for n in skipped)
    assert r.returncode == 0, r.stderr[-3000:]
    # the stage really stopped after its step-1 checkpoint and resumed from it to step 2
    assert checks["resume"]["resumed_from_step"] == 1
    tiny = doc["measurements"]["tiny_stage"]
    assert [s["step"] for s in tiny["steps"]] == [1, 2] and tiny["seconds_per_step_median"] > 0
    assert tiny["generated_tokens_per_s"] > 0 and tiny["trained_tokens_per_s"] > 0
    # the paper's cost was recomputed from the (tiny) probe: the code ran, its figures are not an estimate on CPU
    assert doc["paper_cost"]["steps_per_stage"] == 1000 and "note" in doc["paper_cost"]
