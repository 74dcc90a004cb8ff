"""The GPU check's JSON report: every check it names (`CHECKS`) with `pass`, `fail` or `skipped`, the
measurements and the paper's cost, written after every section; and the check's log line."""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

# every check the JSON names, in order, with what it asserts
CHECKS: dict[str, str] = {
    "imports": "torch, transformers, peft, accelerate, trl, datasets and pydantic import; the project's trainer too",
    "device": "the device asked for is the device used",
    "tiny_model": "a random Qwen3-shaped model with the embedded tokenizer, saved to a temporary folder",
    "stage_child_process": "trainer.child runs the stage (trainer.stage.run_stage) in a child process",
    "transformers_generation": "GRPO's completions come from transformers' generate (use_vllm off)",
    "cuda_training": "the stage trains on the CUDA device",
    "bf16_weights": "the stage trains bf16 weights",
    "lora": "the stage trains a LoRA adapter (peft) and saves it",
    "gradient_checkpointing": "gradient checkpointing is on while the stage trains",
    "fused_lm_head_triton": "TRL's fused LM head runs its Triton kernel (compiled on the first step)",
    "in_stage_checkpoint": "a complete in-stage checkpoint at step N/2 (trainer state, RNG, the reward's marker)",
    "cuda_rng_state": "the in-stage checkpoint holds the CUDA RNG state",
    "interrupted": "SIGTERM after the step-N/2 checkpoint stops the stage there (StageInterrupted, no final checkpoint)",
    "resume": "started again, the stage resumes from step N/2 and ends at step N with its final checkpoint",
    "lora_sync_exact": "the exact LoRA sync sends weights bit-equal to peft's merge_adapter (bf16, on the device)",
    "lora_sync_trl": "TRL's weight iterator, patched by trainer.lora_sync, sends what TRL's own merge would",
    "lora_sync_base_unchanged": "the bf16 base weights are bit-identical after 100 syncs",
    "step_timing": "seconds per GRPO step and tokens/s generated and trained, from the stage's own steps",
    "peak_memory": "peak GPU memory of the stage and of the shape probe",
    "shape_probe": "decoding and a training micro-batch timed on a model of the paper's shape (tiny on CPU)",
    "paper_cost": "the paper preset's cost per stage, recomputed from the probe beside the README's estimate",
    "wall_time": "the whole check within its time budget (8 minutes on one GPU)",
}


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)



class Report:
    """The JSON document: every check of `CHECKS` with its status, the measurements and the paper's cost; written
    after every section, so that a run stopped by its time limit still leaves what it found."""

    def __init__(self, path: Path, device: str, argv: list[str]):
        self.path = path
        self.t0 = time.perf_counter()
        self.doc: dict[str, Any] = {
            "what": "python -m evals.bench.gpu_check: the paper preset's training mechanics on a tiny random model",
            "command": " ".join(["python -m evals.bench.gpu_check", *argv]),
            "device": device,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "machine": {},
            "checks": {name: {"status": "skipped", "reason": "not reached (an earlier section stopped the check)",
                              "asserts": text} for name, text in CHECKS.items()},
            "measurements": {},
            "paper_cost": {},
        }

    def set(self, name: str, status: str, detail: str = "", **data: Any) -> None:
        assert name in CHECKS and status in ("pass", "fail", "skipped"), (name, status)
        entry: dict[str, Any] = {"status": status, "asserts": CHECKS[name]}
        if status == "skipped":
            entry["reason"] = detail or "no reason given"
        elif detail:
            entry["detail"] = detail
        entry.update(data)
        self.doc["checks"][name] = entry
        log(f"{name}: {status}{' - ' + detail if detail else ''}")

    def check(self, name: str, ok: bool, detail: str = "", **data: Any) -> bool:
        self.set(name, "pass" if ok else "fail", detail, **data)
        return ok

    def skip(self, name: str, reason: str) -> None:
        self.set(name, "skipped", reason)

    def write(self) -> None:
        checks = self.doc["checks"]
        self.doc["wall_s"] = round(time.perf_counter() - self.t0, 1)
        self.doc["summary"] = {s: sorted(n for n, c in checks.items() if c["status"] == s)
                               for s in ("pass", "fail", "skipped")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)

    def failed(self) -> list[str]:
        return [n for n, c in self.doc["checks"].items() if c["status"] == "fail"]


def section(report: Report, names: tuple[str, ...]):
    """Run a section; an exception fails its checks that are still unset (with the error) and the check goes on."""

    class _Section:
        def __enter__(self):
            return self

        def __exit__(self, kind, exc, tb):
            if exc is not None:
                text = f"{kind.__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
                log("error:\n" + "".join(traceback.format_exception(kind, exc, tb))[-3000:])
                for name in names:
                    if report.doc["checks"][name].get("reason", "").startswith("not reached"):
                        report.set(name, "fail", text)
            report.write()
            return not isinstance(exc, KeyboardInterrupt)

    return _Section()
