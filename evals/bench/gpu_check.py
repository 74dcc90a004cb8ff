"""The GPU training path, checked in one command: the `paper` preset's mechanics on a tiny random model, timed.

    PYTHONPATH=. python -m evals.bench.gpu_check --device cuda --out gpu_check.json     # one GPU, a few minutes
    python -m evals.bench.gpu_check --device cpu --steps 2 --out /tmp/gpu_check.json    # the same check on CPU

It runs from the source tree (nothing of the project is installed; `docs/gpu.md` says which wheels a bare GPU machine
needs) and writes one JSON file that names every check with `pass`, `fail` or `skipped` (with the reason):

- **the stage child process** (`trainer.child`, which runs `trainer.stage.run_stage`) trains TRL's GRPO on the
  transformers generation path (no vLLM) with the `paper` preset's levers: LoRA, gradient checkpointing, and on CUDA
  bf16 weights and TRL's Triton fused LM head;
- **in-stage checkpoint and resume**: the stage saves at step N/2 (`train.save_steps`), receives SIGTERM right after
  that checkpoint is complete and stops there; started again, it continues from it (`train/resumed_from_step`) to
  step N and leaves its final checkpoint; on CUDA the in-stage checkpoint holds the CUDA RNG state;
- **the exact LoRA sync** (`trainer.lora_sync`): on a bf16 LoRA model on the device, the merged weights it sends are
  bit-equal to peft's `merge_adapter` (and to TRL's own sync), and the frozen base is bit-identical after 100 syncs
  (TRL's merge/unmerge round trip, run beside it on a copy, says how much it would have drifted);
- **measurements**: seconds per GRPO step, tokens/s generated and trained, peak GPU memory, for the tiny model's
  shapes; on CUDA also a Qwen3-4B-shaped random model (bf16, LoRA r=32, gradient checkpointing, TRL's fused head):
  decoding at the paper's 64 completions per step and a training micro-batch of 8 at the paper's lengths, from which
  the `paper` preset's cost per stage is recomputed beside the README's derived estimate (8-14 h on one H100).

The tiny model is a Qwen3 architecture with 2 small layers, randomly initialised and saved to a temporary folder, with
the embedded SmolLM2 tokenizer (`--tokenizer DIR`; by default `.gpu_wheels/tokenizer` when it exists, else the
tokenizer of the embedded model, `llm_backends.models.resolve_model("smollm2-135m")`). Nothing is downloaded.
On CPU the CUDA-specific assertions are skipped, and say so. The exit status is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CARRIED_TOKENIZER = ROOT / ".gpu_wheels" / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")

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

README_ESTIMATE = {
    "source": "README.md, GPU section ('Cost, on paper'): derived, not measured",
    "seconds_per_step": [30, 50],
    "hours_per_stage": [8, 14],
    "generation_s_per_step_vllm": [15, 35],
    "training_s_per_step": 10,
    "logprob_and_sync_s_per_step": [4, 5],
    "gpu": "one H100 80 GB",
}

# Qwen3-4B's shape (its config.json): what the paper preset trains
QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def tiny_shape(vocab_size: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def hide_vllm() -> bool:
    """Make `vllm` unimportable in this process (TRL then never imports it: `importlib.util.find_spec` answers None
    for a module set to None in `sys.modules`). The check runs TRL's transformers path, as on a GPU machine without
    vLLM; where vLLM is installed this also saves its import (over 10 s a process). True if it was importable."""
    import importlib.util

    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    found = importlib.util.find_spec("vllm") is not None
    sys.modules["vllm"] = None  # type: ignore[assignment]
    return found


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ the report


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


# ------------------------------------------------------------------------------------------------ the tiny model


def find_tokenizer(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if (CARRIED_TOKENIZER / "tokenizer.json").is_file():
        return CARRIED_TOKENIZER
    from llm_backends.models import resolve_model

    return resolve_model("smollm2-135m")


def save_tokenizer(dest: Path) -> list[str]:
    """Copy the embedded model's tokenizer files to `dest` (what a GPU machine without the GGUF package needs)."""
    src = _embedded_tokenizer()
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
            copied.append(name)
    return copied


def _embedded_tokenizer() -> Path:
    from llm_backends.models import resolve_model

    return resolve_model("smollm2-135m")


def build_tiny_model(folder: Path, tokenizer_dir: Path, seed: int = 0) -> dict:
    """A random Qwen3 model of `tiny_shape`, saved with the tokenizer in `folder` (float32 safetensors)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = Qwen3Config(**tiny_shape(len(tok)), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return {"params": sum(p.numel() for p in model.parameters()), "layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "tokenizer": str(tokenizer_dir)}


# ------------------------------------------------------------------------------------------------ the stage


def stage_config(device: str, steps: int):
    """The `paper` preset's training levers at the tiny model's scale: LoRA, gradient checkpointing, bf16 weights
    where CUDA supports them (the preset's default), in-stage checkpoints every steps/2, no vLLM (not carried)."""
    from trainer.config import TRAIN_PRESETS, TrainConfig

    raw = dict(TRAIN_PRESETS["paper"])
    cuda = device == "cuda"
    raw.update(
        use_vllm=False,  # the vllm wheel is far over a device call's 64 MiB: TRL's transformers path instead
        lora=True,  # the tiny model is under lora="auto"'s 1B, the paper's 4B is not: LoRA as the paper trains
        max_steps=steps,
        save_steps=max(1, steps // 2),
        logging_steps=1,
        # the paper's groups of 8 and micro-batches of 8 on CUDA, 2 micro-batches a step (the paper has 8); smaller
        # on CPU, where every completion costs seconds
        num_generations=8 if cuda else 4,
        per_device_train_batch_size=8 if cuda else 4,
        gradient_accumulation_steps=2 if cuda else 1,
        max_completion_length=128 if cuda else 16,
    )
    return TrainConfig.model_validate(raw)


def instrumented_stage(*, facts_path, stop_after_save: int | None = None, **run_stage_kwargs) -> None:
    """`trainer.stage.run_stage`, as `trainer.child` runs it, with a probe on its trainer (facts in `facts_path`):
    the model's device, dtype, adapter and checkpointing as trained; each step's seconds; each generation's seconds
    and tokens; TRL's log dicts; launches of TRL's Triton fused-head kernel; peak GPU memory. With
    `stop_after_save=S`, the child sends itself SIGTERM once the step-S checkpoint is complete (its own signal
    handler: the first signal stops at the step boundary, `trainer.child`), and the stage ends there."""
    hide_vllm()
    import trainer.stage as stage_mod

    original = stage_mod.quiet_trainer

    def quiet_and_probed(trainer, progress, label):
        original(trainer, progress, label)
        _instrument(trainer, Path(facts_path), stop_after_save)

    stage_mod.quiet_trainer = quiet_and_probed
    try:
        stage_mod.run_stage(**run_stage_kwargs)
    finally:
        stage_mod.quiet_trainer = original


class _CountLaunches:
    """A Triton kernel, counting its launches (`kernel[grid](...)`) and passing everything else through."""

    def __init__(self, fn):
        self.fn = fn
        self.launches = 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.fn[grid]

    def __getattr__(self, name):
        return getattr(self.fn, name)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _instrument(trainer, facts_path: Path, stop_after_save: int | None) -> None:
    import torch
    from transformers import TrainerCallback

    facts: dict[str, Any] = {"steps": [], "generations": [], "logs": [], "pid": os.getpid()}

    def save() -> None:
        tmp = facts_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(facts, default=str))
        os.replace(tmp, facts_path)

    kernels = {}
    try:
        from trl.kernels import chunked_logprob as ck

        for name in ("_forward_kernel", "_backward_kernel"):
            fn = getattr(ck, name)
            if not isinstance(fn, _CountLaunches) and hasattr(fn, "__getitem__"):
                setattr(ck, name, _CountLaunches(fn))
            kernels[name] = getattr(ck, name)
        facts["triton_available"] = bool(getattr(ck, "_TRITON_AVAILABLE", False))
    except ImportError as e:
        facts["triton_error"] = str(e)

    generate = trainer._generate_single_turn

    def timed_generate(*args, **kwargs):
        _sync()
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        _sync()
        completions = out[0]
        facts["generations"].append({"step": int(trainer.state.global_step) + 1, "seconds": time.perf_counter() - t0,
                                     "completions": len(completions),
                                     "tokens": int(sum(len(c) for c in completions))})
        return out

    trainer._generate_single_turn = timed_generate
    clock: dict[str, float] = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            model = model or trainer.model
            named = list(model.named_parameters())
            base = [p for n, p in named if "lora_" not in n]
            facts.update(
                device=str(base[0].device),
                base_dtype=str(base[0].dtype).removeprefix("torch."),
                lora_dtype=next((str(p.dtype).removeprefix("torch.") for n, p in named if "lora_" in n), None),
                is_peft=hasattr(model, "peft_config"),
                lora_params=sum(p.numel() for n, p in named if "lora_" in n),
                trainable_params=sum(p.numel() for _, p in named if p.requires_grad),
                gradient_checkpointing=any(getattr(m, "gradient_checkpointing", False) is True
                                           for m in model.modules()),
                use_vllm=bool(getattr(trainer, "use_vllm", None)),
                args_bf16=bool(args.bf16),
                args_gradient_checkpointing=bool(args.gradient_checkpointing),
                start_step=int(state.global_step),
            )
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            save()

        def on_step_begin(self, args, state, control, **kwargs):
            _sync()
            clock["step"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync()
            facts["steps"].append({"step": int(state.global_step), "seconds": time.perf_counter() - clock["step"]})
            if torch.cuda.is_available():
                facts["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
            facts["triton_launches"] = {k: getattr(v, "launches", None) for k, v in kernels.items()}
            save()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                facts["logs"].append({"step": int(state.global_step), **logs})

        def on_save(self, args, state, control, **kwargs):
            if stop_after_save and state.global_step == stop_after_save:
                facts["sigterm_after_step"] = int(state.global_step)
                save()
                os.kill(os.getpid(), signal.SIGTERM)  # trainer.child's handler: stop at the step boundary
                control.should_training_stop = True  # ... which is this one: no step after the checkpoint
            return control

        def on_train_end(self, args, state, control, **kwargs):
            facts["end_step"] = int(state.global_step)
            if torch.cuda.is_available():
                facts["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
            facts["triton_launches"] = {k: getattr(v, "launches", None) for k, v in kernels.items()}
            save()

    trainer.add_callback(Probe())
    save()


def run_stage_checks(report: Report, device: str, model_dir: Path, work: Path, steps: int) -> dict:
    """The interrupted stage and its resume, each in trainer.child's child process; returns both runs' facts."""
    import torch

    from env import generate, uniform_config, write_jsonl
    from trainer.child import run_in_child
    from trainer.stop import StageInterrupted

    cuda = device == "cuda"
    cfg = stage_config(device, steps)
    half = cfg.save_steps
    prompts_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps // cfg.num_generations
    train = work / "train.jsonl"
    write_jsonl(train, generate(uniform_config(), max(8, steps * prompts_per_step), seed=0).instances)
    out = work / "stage_0"
    shutil.rmtree(out, ignore_errors=True)  # a folder left by an earlier check would be resumed from
    kwargs = dict(train_path=train, init_checkpoint=model_dir, out_dir=out, cfg=cfg, seed=0, reward_state=None,
                  progress=False, warm_start=False)
    report.doc["measurements"]["stage_config"] = {
        k: getattr(cfg, k) for k in ("prompt_style", "num_generations", "per_device_train_batch_size",
                                     "gradient_accumulation_steps", "max_completion_length", "max_prompt_length",
                                     "max_steps", "save_steps", "lora", "lora_r", "lora_alpha",
                                     "gradient_checkpointing", "bf16", "use_vllm", "loss_type", "temperature")}
    target = "evals.bench.gpu_check:instrumented_stage"
    facts_a, facts_b = work / "facts_interrupted.json", work / "facts_resumed.json"

    log(f"stage run 1: {steps} steps planned, checkpoint at step {half}, SIGTERM right after it")
    t0 = time.perf_counter()
    interrupted_error = None
    try:
        run_in_child(out, dict(kwargs, facts_path=facts_a, stop_after_save=half), label="gpu check stage (run 1)",
                     target=target)
    except StageInterrupted as e:
        interrupted_error = str(e)
    run1_s = time.perf_counter() - t0
    a = json.loads(facts_a.read_text()) if facts_a.exists() else {}
    status1 = json.loads((out / "logs" / "stage_status.json").read_text())
    report.check("stage_child_process", status1.get("status") in ("ok", "interrupted") and a.get("pid") not in
                 (None, os.getpid()), f"run 1 in child pid {a.get('pid')} (this process: {os.getpid()}), status "
                 f"{status1.get('status')}, {run1_s:.1f} s with start-up", status_file=status1)

    trl_dir = out / "trl"
    ckpt = trl_dir / f"checkpoint-{half}"
    marker = ckpt / "stage_resume.json"
    found = sorted(p.name for p in trl_dir.iterdir()) if trl_dir.is_dir() else []
    need = ("trainer_state.json", "rng_state.pth", "optimizer.pt", "adapter_model.safetensors")
    missing = [n for n in need if not (ckpt / n).exists()]
    marker_step = json.loads(marker.read_text()).get("global_step") if marker.exists() else None
    report.check("in_stage_checkpoint", not missing and marker_step == half,
                 f"{ckpt.name}: marker at step {marker_step}, missing {missing or 'nothing'}; trl/ holds {found}")
    report.check("interrupted", interrupted_error is not None and a.get("end_step") == half
                 and a.get("sigterm_after_step") == half and not (out / "checkpoint").exists(),
                 f"StageInterrupted: {(interrupted_error or 'not raised')[:160]}; stopped at step {a.get('end_step')}"
                 f", no final checkpoint: {not (out / 'checkpoint').exists()}")
    if cuda:
        try:
            rng = torch.load(ckpt / "rng_state.pth", weights_only=False)
            keys = sorted(rng) if isinstance(rng, dict) else []
            report.check("cuda_rng_state", "cuda" in keys, f"rng_state.pth keys: {keys}")
        except Exception as e:  # noqa: BLE001 - reported as the check's failure
            report.check("cuda_rng_state", False, f"{type(e).__name__}: {e}")
    else:
        report.skip("cuda_rng_state", "CPU run: the CUDA RNG state exists only on CUDA (the CPU's is saved)")
    report.write()

    log(f"stage run 2: resume from step {half} to step {steps}")
    t0 = time.perf_counter()
    run_in_child(out, dict(kwargs, facts_path=facts_b, stop_after_save=None), label="gpu check stage (run 2)",
                 target=target)
    run2_s = time.perf_counter() - t0
    b = json.loads(facts_b.read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    meta = json.loads((out / "checkpoint" / "trainer_meta.json").read_text())
    resumed = metrics.get("train/resumed_from_step")
    report.check("resume", resumed == half and metrics.get("train/steps") == steps and b.get("start_step") == half
                 and meta.get("grpo_steps") == steps and not trl_dir.exists(),
                 f"resumed_from_step {resumed}, trained steps {b.get('start_step')} -> {b.get('end_step')}, "
                 f"train/steps {metrics.get('train/steps')}, final checkpoint {sorted(os.listdir(out / 'checkpoint'))}"
                 f", trl/ removed: {not trl_dir.exists()} ({run2_s:.1f} s with start-up)",
                 resumed_from_step=resumed)

    gens = a.get("generations", []) + b.get("generations", [])
    report.check("transformers_generation", not a.get("use_vllm") and not b.get("use_vllm") and len(gens) > 0
                 and all(g["tokens"] > 0 for g in gens),
                 f"{len(gens)} generations with transformers, {sum(g['tokens'] for g in gens)} tokens; use_vllm "
                 f"{a.get('use_vllm')}")
    report.check("lora", a.get("is_peft") and b.get("is_peft") and meta.get("is_lora") is True
                 and (out / "checkpoint" / "adapter_model.safetensors").is_file(),
                 f"adapter of {a.get('lora_params')} parameters ({a.get('lora_dtype')}), trainable "
                 f"{a.get('trainable_params')}; checkpoint is_lora {meta.get('is_lora')}")
    report.check("gradient_checkpointing", bool(a.get("gradient_checkpointing") and b.get("gradient_checkpointing")),
                 f"on in the model while training: {a.get('gradient_checkpointing')}, {b.get('gradient_checkpointing')}")
    if cuda:
        report.check("cuda_training", a.get("device", "").startswith("cuda") and b.get("device", "").startswith("cuda")
                     and metrics.get("train/device") == "cuda",
                     f"weights on {a.get('device')}, metrics train/device {metrics.get('train/device')}")
        report.check("bf16_weights", a.get("base_dtype") == "bfloat16" and b.get("base_dtype") == "bfloat16",
                     f"base weights {a.get('base_dtype')}, adapter {a.get('lora_dtype')}, GRPOConfig bf16 "
                     f"{a.get('args_bf16')}")
        launches = {k: (a.get("triton_launches") or {}).get(k, 0) or 0 for k in ("_forward_kernel", "_backward_kernel")}
        first = [s["seconds"] for s in a.get("steps", [])][:1]
        report.check("fused_lm_head_triton", launches["_forward_kernel"] > 0 and launches["_backward_kernel"] > 0,
                     f"Triton launches in run 1: {launches}; first step {first[0] if first else '?'} s (compiles)")
    else:
        report.skip("cuda_training", "CPU run (--device cpu)")
        report.skip("bf16_weights", "CPU run: the project trains float32 weights off CUDA (train.bf16 auto)")
        report.skip("fused_lm_head_triton", "CPU run: TRL folds the fused head's tiles in torch where there is no "
                    "Triton device")
    report.write()
    return {"a": a, "b": b, "cfg": cfg, "metrics": metrics}


def step_measurements(report: Report, runs: dict, device: str) -> None:
    """Seconds per step and tokens/s from both runs' steps; the first step of each run (Triton compiles, caches warm)
    is reported apart."""
    a, b, cfg = runs["a"], runs["b"], runs["cfg"]
    rows = []
    for facts in (a, b):
        gens = {}
        for g in facts.get("generations", []):
            gens.setdefault(g["step"], []).append(g)
        logs = {lg["step"]: lg for lg in facts.get("logs", []) if "loss" in lg}
        for i, s in enumerate(facts.get("steps", [])):
            g = gens.get(s["step"], [])
            completions = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
            lg = logs.get(s["step"], {})
            mean_len = lg.get("completions/mean_length")
            rows.append({"step": s["step"], "seconds": round(s["seconds"], 4), "first_of_run": i == 0,
                         "generate_seconds": round(sum(x["seconds"] for x in g), 4),
                         "generated_tokens": sum(x["tokens"] for x in g),
                         "completions": completions, "completion_mean_length": mean_len,
                         "loss": lg.get("loss")})
    steady = [r for r in rows if not r["first_of_run"]] or rows
    sec = statistics.median(r["seconds"] for r in steady)
    gen_s = sum(r["generate_seconds"] for r in steady)
    gen_tok = sum(r["generated_tokens"] for r in steady)
    # tokens trained a step: every completion with its prompt (the prompts' mean length from TRL's token count)
    num_tokens = [lg.get("num_tokens") for lg in (a.get("logs", []) + b.get("logs", [])) if lg.get("num_tokens")]
    trained_per_step = None
    if len(num_tokens) >= 2:
        steps_seen = [lg["step"] for lg in (a.get("logs", []) + b.get("logs", [])) if lg.get("num_tokens")]
        trained_per_step = (num_tokens[-1] - num_tokens[0]) / max(1, steps_seen[-1] - steps_seen[0])
    train_s = sum(r["seconds"] - r["generate_seconds"] for r in steady)
    m = {
        "steps": rows,
        "seconds_per_step_median": round(sec, 4),
        "first_step_seconds": rows[0]["seconds"] if rows else None,
        "generated_tokens_per_s": round(gen_tok / gen_s, 1) if gen_s else None,
        "tokens_trained_per_step": trained_per_step,
        "trained_tokens_per_s": round(trained_per_step * len(steady) / train_s, 1)
        if trained_per_step and train_s > 0 else None,
        "peak_gpu_gib": round(max(a.get("peak_gpu_bytes", 0), b.get("peak_gpu_bytes", 0)) / 2**30, 3)
        if device == "cuda" else None,
        "note": "tiny model: these figures time the mechanics (launches, Python, the trainer), not a 4B model",
    }
    report.doc["measurements"]["tiny_stage"] = m
    ok = bool(rows) and all(r["seconds"] > 0 for r in rows) and m["generated_tokens_per_s"] is not None
    report.check("step_timing", ok, f"{len(rows)} steps, median {sec:.3f} s a step (first {m['first_step_seconds']} s)"
                 f", {m['generated_tokens_per_s']} tokens/s generated, {m['trained_tokens_per_s']} tokens/s trained")


# ------------------------------------------------------------------------------------------------ the LoRA sync


def lora_sync_checks(report: Report, device: str, model_dir: Path, cycles: int = 100) -> None:
    """trainer.lora_sync on a bf16 LoRA model of the tiny model on the device: exact against peft's merge_adapter
    and TRL's own iterator, and the base unchanged after `cycles` syncs; TRL's merge/unmerge drift beside it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.lora_sync import exact_merged_params, install_exact_lora_sync

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    # init_lora_weights=False: B is random, so every merge changes the weights, as after training
    model = get_peft_model(base, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", lora_dropout=0.0,
                                            init_lora_weights=False))

    def fix(name: str, extra_prefixes=None) -> str:  # TRL's VLLMGeneration._fix_param_name_to_vllm
        for prefix in ["_checkpoint_wrapped_module.", *(extra_prefixes or [])]:
            name = name.replace(prefix, "")
        return name

    def frozen(m) -> dict:
        return {n: p.detach().clone() for n, p in m.named_parameters() if "lora_" not in n}

    def peft_merged(m) -> dict:
        twin = copy.deepcopy(m)
        twin.merge_adapter()
        return {fix(n.removeprefix("base_model.model.").replace(".base_layer", ""),
                    extra_prefixes=["modules_to_save.default."]): p.detach().clone()
                for n, p in twin.named_parameters() if "lora_" not in n and "original_module" not in n}

    def nudge(m, step: int) -> None:  # an optimiser step between syncs: the adapter moves, the base does not
        g = torch.Generator(device="cpu").manual_seed(step)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_" in n:
                    p.add_((torch.randn(p.shape, generator=g) * 1e-3).to(device=p.device, dtype=p.dtype))

    lora_dtype = next(p.dtype for n, p in model.named_parameters() if "lora_" in n)
    start = frozen(model)
    trl_patch = install_exact_lora_sync()
    gen = None
    if trl_patch:
        from contextlib import nullcontext
        from types import SimpleNamespace

        from trl.generation.vllm_generation import VLLMGeneration

        gen = SimpleNamespace(model=model, _dist=SimpleNamespace(is_fsdp=False,
                                                                 gather_params=lambda params: nullcontext()),
                              _fix_param_name_to_vllm=fix)
    mismatched, compared, trl_mismatched, trl_compared = [], 0, [], 0
    t0 = time.perf_counter()
    for i in range(cycles):
        nudge(model, i)
        sent = {n: t.clone() if i in (0, cycles - 1) else t for n, t in exact_merged_params(model, fix)}
        if i in (0, cycles - 1):
            want = peft_merged(model)
            compared += 1
            if list(sent) != list(want):
                mismatched.append(f"cycle {i}: names differ")
            mismatched += [f"cycle {i}: {n}" for n in want if n in sent and not torch.equal(sent[n], want[n])]
            if gen is not None:
                trl_own = {n: t.clone() for n, t in VLLMGeneration._trl_iter_named_params(
                    SimpleNamespace(**{**vars(gen), "model": copy.deepcopy(model)}))}
                via_trl = {n: t.clone() for n, t in VLLMGeneration._iter_named_params(gen)}
                trl_compared += 1
                if list(via_trl) != list(trl_own):
                    trl_mismatched.append(f"cycle {i}: names differ")
                trl_mismatched += [f"cycle {i}: {n}" for n in trl_own
                                   if n in via_trl and not torch.equal(via_trl[n], trl_own[n])]
            changed = sum(int(not torch.equal(sent[n], start[f"base_model.model.{n}".replace(
                ".weight", ".base_layer.weight")])) for n in sent
                if f"base_model.model.{n}".replace(".weight", ".base_layer.weight") in start)
            if changed == 0:
                mismatched.append(f"cycle {i}: the merged weights equal the base (the adapter merged nothing)")
    _sync()
    sync_s = (time.perf_counter() - t0) / cycles
    now = frozen(model)
    drifted = [n for n in start if not torch.equal(now[n], start[n])]

    # TRL's own merge/unmerge round trip on a copy, as many times: what the exact sync avoids
    twin = copy.deepcopy(model)
    twin_start = frozen(twin)
    for i in range(cycles):
        nudge(twin, i)
        twin.merge_adapter()
        twin.unmerge_adapter()
    twin_now = frozen(twin)
    drift_elems = sum(int((twin_now[n] != twin_start[n]).sum()) for n in twin_start)
    drift_max = max(float((twin_now[n].float() - twin_start[n].float()).abs().max()) for n in twin_start)
    total = sum(t.numel() for t in twin_start.values())
    where = f"{device}, base bf16, adapter {str(lora_dtype).removeprefix('torch.')}"
    report.doc["measurements"]["lora_sync"] = {
        "device": device, "cycles": cycles, "seconds_per_sync_tiny": round(sync_s, 5),
        "trl_merge_unmerge_drift": {"changed_elements": drift_elems, "of": total, "max_abs": drift_max}}
    report.check("lora_sync_exact", not mismatched and compared == 2,
                 f"{compared} syncs compared tensor by tensor with peft's merge_adapter ({where}): "
                 f"{len(mismatched)} differ{': ' + ', '.join(mismatched[:5]) if mismatched else ''}")
    if gen is None:
        report.skip("lora_sync_trl", "TRL's vLLM generation module could not be imported, so there is nothing to "
                    "patch")
    else:
        report.check("lora_sync_trl", not trl_mismatched and trl_compared == 2,
                     f"{trl_compared} syncs through TRL's patched iterator against TRL's own merge: "
                     f"{len(trl_mismatched)} differ{': ' + ', '.join(trl_mismatched[:5]) if trl_mismatched else ''}")
    report.check("lora_sync_base_unchanged", not drifted,
                 f"after {cycles} syncs {len(drifted)} of {len(start)} base tensors changed; TRL's merge/unmerge "
                 f"on a copy changed {drift_elems} of {total} base elements (max {drift_max:.3g})")
    del model, twin, base


# ------------------------------------------------------------------------------------------------ the shape probe


def shape_probe(report: Report, device: str, tokenizer_dir: Path, seed: int = 0) -> dict | None:
    """On CUDA: a Qwen3-4B-shaped random model in bf16 on the GPU. Decoding: 64 completions (one paper step) after
    prompts of the paper's length, timed with transformers' generate; training: a micro-batch of 8 sequences of
    the paper's prompt plus answer length, forward and backward with LoRA r=32, gradient checkpointing and TRL's
    fused LM head. On CPU the same code on the tiny shape and small sizes (figures meaningless, code exercised)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    cuda = device == "cuda"
    if cuda:
        shape, batch, prompt, new, micro, answer = dict(QWEN3_4B), 64, 576, 64, 8, 1472
    else:
        from transformers import AutoTokenizer

        shape = tiny_shape(len(AutoTokenizer.from_pretrained(tokenizer_dir)))
        batch, prompt, new, micro, answer = 4, 64, 8, 2, 64
    torch.manual_seed(seed)
    cfg = Qwen3Config(**shape)
    dtype = torch.bfloat16 if cuda else torch.float32
    t0 = time.perf_counter()
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    log(f"shape probe: {params / 1e9:.3f} B parameters ({dtype}) on {device} in {build_s:.1f} s")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(100, cfg.vocab_size - 100, (batch, prompt), device=device)
    mask = torch.ones_like(ids)

    def gen(n: int) -> float:
        _sync()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
        _sync()
        return time.perf_counter() - t

    gen(2)  # warm-up: kernels, allocator
    prefill_s = min(gen(1) for _ in range(2))
    full_s = gen(new)
    token_step_s = (full_s - prefill_s) / (new - 1)
    decode_peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    # training: LoRA (all linear layers, the paper's r=32) over the frozen base, checkpointing, TRL's fused head
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.05, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    seq = prompt + answer
    x = torch.randint(100, cfg.vocab_size - 100, (micro, seq), device=device)
    labels = x.clone()
    labels[:, :prompt] = -100  # only the answers are scored, as in GRPO

    def train_step() -> float:
        _sync()
        t = time.perf_counter()
        out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=labels, fused_lm_head=True)
        (out.loss - 0.01 * out.entropy[labels[:, 1:] != -100].mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync()
        return time.perf_counter() - t

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    first_train_s = train_step()  # compiles TRL's Triton kernels at this shape on the first call
    train_s = statistics.median(train_step() for _ in range(2 if cuda else 1))
    train_peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    probe = {
        "shape": "Qwen3-4B" if cuda else "tiny (CPU: figures time the code, not a 4B model)",
        "params": params, "dtype": str(dtype).removeprefix("torch."), "build_s": round(build_s, 2),
        "decode": {"batch": batch, "prompt_tokens": prompt, "new_tokens": new, "prefill_s": round(prefill_s, 4),
                   "seconds_per_token_step": round(token_step_s, 5),
                   "tokens_per_s": round(batch / token_step_s, 1) if token_step_s > 0 else None,
                   "path": "transformers generate (TRL's use_vllm=false path), dynamic KV cache, sampling"},
        "train_micro_batch": {"sequences": micro, "prompt_tokens": prompt, "answer_tokens": answer,
                              "seconds": round(train_s, 4), "first_seconds": round(first_train_s, 4),
                              "tokens_per_s": round(micro * seq / train_s, 1),
                              "lora_r": 32, "gradient_checkpointing": True, "fused_lm_head": True},
        "peak_gpu_gib": {"decode": round(decode_peak, 2), "train": round(train_peak, 2)} if cuda else None,
    }
    report.doc["measurements"]["shape_probe"] = probe
    report.check("shape_probe", token_step_s > 0 and train_s > 0,
                 f"{probe['shape']}: decode {token_step_s * 1e3:.2f} ms a token step at batch {batch} "
                 f"({probe['decode']['tokens_per_s']} tokens/s), training micro-batch {micro} x {seq} tokens in "
                 f"{train_s:.3f} s ({probe['train_micro_batch']['tokens_per_s']} tokens/s; first {first_train_s:.2f} s)")
    model = opt = None  # the probe's memory back before the next section
    if cuda:
        torch.cuda.empty_cache()
    return probe


def paper_prompt_tokens(tokenizer_dir: Path, n: int = 64) -> float:
    """Mean token count of the paper's full prompt (chat template applied, thinking off) over `n` instances drawn
    as a paper stage draws them (every size), with the embedded tokenizer, as the README counts them."""
    from transformers import AutoTokenizer

    from env import generate, uniform_config
    from llm_backends.policy import template_kwargs
    from trainer.data import build_dataset, prompt_tokens

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    kw = template_kwargs(False)
    rows, _ = build_dataset(generate(uniform_config(), n, seed=1).instances, tok, 1 << 20, "full", kw)
    lengths = [prompt_tokens(tok, row["prompt"], kw) for row in rows]
    return statistics.fmean(lengths)


def paper_cost(probe: dict, prompt_tokens: float) -> dict:
    """The `paper` preset's cost per stage from the probe's figures: 1,000 optimiser steps of 64 completions (4,000
    instances x 8 completions x 2 epochs), each step's generation as long as its longest answer, its training 8
    micro-batches of 8; answers of 1,000-2,000 tokens on average (the README's assumption), the longest at the cap."""
    from trainer.config import TRAIN_PRESETS, TrainConfig

    cfg = TrainConfig.model_validate(TRAIN_PRESETS["paper"])
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    steps = int(-(-cfg.instances_per_stage * cfg.num_generations // per_step) * cfg.epochs)
    micro = probe["train_micro_batch"]
    micro_tokens = micro["sequences"] * (micro["prompt_tokens"] + micro["answer_tokens"])
    s_per_token = micro["seconds"] / micro_tokens  # training cost is about linear in tokens at these lengths
    decode = probe["decode"]
    longest = cfg.max_completion_length
    out: dict[str, Any] = {"steps_per_stage": steps, "completions_per_step": per_step,
                           "prompt_tokens_mean": round(prompt_tokens, 1), "longest_answer_tokens": longest,
                           "scenarios": {}}
    for label, answer in (("answers_1000", 1000), ("answers_2000", 2000)):
        train_step_s = per_step * (prompt_tokens + answer) * s_per_token
        gen_tf = decode["prefill_s"] + longest * decode["seconds_per_token_step"]
        measured = gen_tf + train_step_s
        vllm = [g + train_step_s + s for g, s in zip(README_ESTIMATE["generation_s_per_step_vllm"],
                                                     README_ESTIMATE["logprob_and_sync_s_per_step"], strict=True)]
        out["scenarios"][label] = {
            "training_s_per_step": round(train_step_s, 1),
            "generation_s_per_step_transformers": round(gen_tf, 1),
            "step_s_transformers_path": round(measured, 1),
            "hours_per_stage_transformers_path": round(steps * measured / 3600, 1),
            "step_s_with_readme_vllm_generation": [round(v, 1) for v in vllm],
            "hours_per_stage_with_readme_vllm_generation": [round(steps * v / 3600, 1) for v in vllm],
        }
    out["readme_estimate"] = README_ESTIMATE
    out["how"] = ("training: the probe's micro-batch seconds per token x 64 completions x (prompt + answer) tokens; "
                  "generation on the transformers path: prefill + 4,096 token steps at batch 64 (the KV cache's growth "
                  "past the probe's context is not counted, so a floor); with vLLM (the preset's path, not carried): "
                  "the README's 15-35 s generation and 4-5 s of log-probabilities and weight sync, plus the measured "
                  "training. An H200 decodes about 1.4x faster than an H100 (memory bandwidth) and trains at about "
                  "the same speed (the same bf16 compute)")
    return out


# ------------------------------------------------------------------------------------------------ main


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


if __name__ == "__main__":
    sys.exit(main())
