"""The GPU training path, checked in one command: the `paper` preset's mechanics on a tiny random model, timed.

The command line: runs the sections in order (imports, device, tiny model, stage and resume, step timing, LoRA sync,
shape probe and paper cost, peak memory, wall time) into one `Report`, and exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evals.bench.gpu_check.lora_sync import lora_sync_checks
from evals.bench.gpu_check.model import ROOT, build_tiny_model, find_tokenizer, hide_vllm, save_tokenizer
from evals.bench.gpu_check.report import Report, log, section
from evals.bench.gpu_check.stage import run_stage_checks
from evals.bench.gpu_check.timing import paper_cost, paper_prompt_tokens, shape_probe, step_measurements


def machine(device: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpu_count": os.cpu_count()}
    for pkg in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "pydantic", "pydantic-core",
                "pyarrow", "pandas", "fsspec", "huggingface-hub", "tokenizers", "triton", "typing-extensions"):
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            info[pkg] = None
    info["cuda_available"] = torch.cuda.is_available()
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    capability=f"{p.major}.{p.minor}", bf16=torch.cuda.is_bf16_supported())
    return info


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is one")
    p.add_argument("--out", type=Path, default=None, help="the JSON file (default: runs/gpu_check/<device>.json)")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps of the stage, checkpointed and interrupted at "
                   "half of them, then resumed (default 4: checkpoint at 2, resume to 4)")
    p.add_argument("--tokenizer", default=None, help="folder with the SmolLM2 tokenizer files (default: "
                   ".gpu_wheels/tokenizer if present, else the embedded model's)")
    p.add_argument("--save-tokenizer", type=Path, default=None, metavar="DIR",
                   help="copy the embedded tokenizer's files to DIR (for a machine without the GGUF package) and exit")
    p.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one, removed)")
    p.add_argument("--budget-s", type=float, default=None, help="the wall-time check's limit (default: 480 on cuda)")
    p.add_argument("--no-probe", action="store_true", help="skip the shape probe and the paper's cost")
    a = p.parse_args(argv)
    if a.save_tokenizer is not None:
        print(json.dumps({"saved": save_tokenizer(a.save_tokenizer), "to": str(a.save_tokenizer)}))
        return 0
    if a.steps < 2:
        p.error("--steps must be at least 2 (a checkpoint at half of them, then a resume)")
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # this process and the stage's child alike
        # one thread: the CPU run checks mechanics and times nothing, and on a shared 2-core machine two threads
        # that wait on each other run the tiny model several times slower than one
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    vllm_here = hide_vllm()
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = a.out or ROOT / "runs" / "gpu_check" / f"{device}.json"
    report = Report(out, device, argv)
    budget = a.budget_s if a.budget_s is not None else (480.0 if device == "cuda" else None)
    work = a.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"device {device}, work folder {work}, JSON {out}")
    try:
        with section(report, ("imports",)):
            report.doc["machine"] = machine(device)
            report.doc["machine"]["vllm"] = ("installed, hidden from the check (TRL's transformers path is checked)"
                                             if vllm_here else "not installed")
            import accelerate  # noqa: F401
            import datasets  # noqa: F401
            import peft  # noqa: F401
            import pydantic  # noqa: F401
            import transformers  # noqa: F401
            import trl  # noqa: F401

            import trainer.child  # noqa: F401
            import trainer.stage  # noqa: F401

            mach = report.doc["machine"]
            report.check("imports", True, ", ".join(f"{k} {mach.get(k)}" for k in (
                "torch", "transformers", "trl", "peft", "accelerate", "datasets", "pydantic")))
        if report.doc["checks"]["imports"]["status"] != "pass":
            return _finish(report, work, a.work is None, budget)
        with section(report, ("device",)):
            if device == "cuda" and not torch.cuda.is_available():
                report.check("device", False, "--device cuda, and torch sees no CUDA device")
                return _finish(report, work, a.work is None, budget)
            report.check("device", True, f"{report.doc['machine'].get('gpu') or 'CPU'} ({device})")
        tokenizer_dir = find_tokenizer(a.tokenizer)
        model_dir = work / "tiny_qwen3"
        with section(report, ("tiny_model",)):
            info = build_tiny_model(model_dir, tokenizer_dir)
            report.doc["measurements"]["tiny_model"] = info
            report.check("tiny_model", (model_dir / "config.json").is_file(),
                         f"Qwen3, {info['layers']} layers, hidden {info['hidden_size']}, vocabulary "
                         f"{info['vocab_size']}, {info['params'] / 1e6:.2f} M parameters; tokenizer {tokenizer_dir}")
        stage_names = ("stage_child_process", "in_stage_checkpoint", "interrupted", "cuda_rng_state", "resume",
                       "transformers_generation", "lora", "gradient_checkpointing", "cuda_training", "bf16_weights",
                       "fused_lm_head_triton", "step_timing")
        runs = None
        with section(report, stage_names):
            runs = run_stage_checks(report, device, model_dir, work, a.steps)
        if runs is not None:
            with section(report, ("step_timing",)):
                step_measurements(report, runs, device)
        with section(report, ("lora_sync_exact", "lora_sync_trl", "lora_sync_base_unchanged")):
            lora_sync_checks(report, device, model_dir)
        probe = None
        if a.no_probe:
            report.skip("shape_probe", "--no-probe")
            report.skip("paper_cost", "--no-probe")
        else:
            with section(report, ("shape_probe", "paper_cost")):
                probe = shape_probe(report, device, tokenizer_dir)
            with section(report, ("paper_cost",)):
                if probe is not None:
                    cost = paper_cost(probe, paper_prompt_tokens(tokenizer_dir))
                    report.doc["paper_cost"] = cost
                    if device == "cuda":
                        sc = cost["scenarios"]
                        report.check("paper_cost", True, "hours per stage on this GPU: transformers path "
                                     f"{sc['answers_1000']['hours_per_stage_transformers_path']}-"
                                     f"{sc['answers_2000']['hours_per_stage_transformers_path']}, with the README's "
                                     f"vLLM generation {sc['answers_1000']['hours_per_stage_with_readme_vllm_generation'][0]}"
                                     f"-{sc['answers_2000']['hours_per_stage_with_readme_vllm_generation'][1]}; "
                                     "README: 8-14 (derived)")
                    else:
                        report.doc["paper_cost"]["note"] = "computed from the CPU probe of the tiny model: the code " \
                            "path only, no estimate of anything"
                        report.skip("paper_cost", "CPU run: the probe timed the tiny model, not the Qwen3-4B shape "
                                    "(the recomputation ran, its figures mean nothing here)")
        if device == "cuda":
            with section(report, ("peak_memory",)):
                tiny = report.doc["measurements"].get("tiny_stage", {}).get("peak_gpu_gib")
                pr = (probe or {}).get("peak_gpu_gib") or {}
                report.check("peak_memory", tiny is not None and bool(pr) or tiny is not None and a.no_probe,
                             f"tiny stage {tiny} GiB; probe decode {pr.get('decode')} GiB, training micro-batch "
                             f"{pr.get('train')} GiB")
        else:
            report.skip("peak_memory", "CPU run: peak GPU memory exists only on CUDA")
    finally:
        pass
    return _finish(report, work, a.work is None, budget)


def _finish(report: Report, work: Path, remove: bool, budget: float | None) -> int:
    wall = time.perf_counter() - report.t0
    if budget is None:
        report.skip("wall_time", f"no budget on {report.doc['device']} (the 480 s limit is the GPU run's); took "
                    f"{wall:.0f} s")
    else:
        report.check("wall_time", wall <= budget, f"{wall:.0f} s of {budget:.0f} s")
    report.write()
    if remove:
        shutil.rmtree(work, ignore_errors=True)
    s = report.doc["summary"]
    log(f"done in {wall:.0f} s: {len(s['pass'])} pass, {len(s['fail'])} fail, {len(s['skipped'])} skipped -> "
        f"{report.path}")
    if s["fail"]:
        log("failed: " + ", ".join(s["fail"]))
    return 1 if s["fail"] else 0
