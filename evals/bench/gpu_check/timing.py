"""The GPU check's measurements: seconds per step and tokens/s from the stage's own steps, the shape probe (a
Qwen3-4B-shaped random model on CUDA, the tiny shape on CPU) and the `paper` preset's cost per stage recomputed from
it beside the README's derived estimate."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from evals.bench.gpu_check.model import QWEN3_4B, cuda_sync, tiny_shape
from evals.bench.gpu_check.report import Report, log

README_ESTIMATE = {
    "source": "README.md, GPU section ('Cost, on paper'): derived, not measured",
    "seconds_per_step": [30, 50],
    "hours_per_stage": [8, 14],
    "generation_s_per_step_vllm": [15, 35],
    "training_s_per_step": 10,
    "logprob_and_sync_s_per_step": [4, 5],
    "gpu": "one H100 80 GB",
}


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
        cuda_sync()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
        cuda_sync()
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
        cuda_sync()
        t = time.perf_counter()
        out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=labels, fused_lm_head=True)
        (out.loss - 0.01 * out.entropy[labels[:, 1:] != -100].mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cuda_sync()
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
    from env.task import MapfTask
    from llm_backends.policy import template_kwargs
    from trainer.data import build_dataset, prompt_tokens

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    kw = template_kwargs(False)
    rows, _ = build_dataset(generate(uniform_config(), n, seed=1).instances, tok, 1 << 20, "full", kw, task=MapfTask())
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
