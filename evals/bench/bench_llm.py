"""Answers per second for 64 validation prompts with the embedded model: vLLM server vs in-process engine.

    python -m evals.bench.bench_llm                       # both backends, 64 prompts, 128 tokens each
    python -m evals.bench.bench_llm --only local --n 16   # one backend, fewer prompts
    python -m evals.bench.bench_llm --json bench.json     # also write the figures

Prompts are ``env.render_prompt`` of ``n`` instances taken at an even stride across the whole
``env.load_split("val")`` (it is sorted by grid size, so the first ``n`` would be the small grids only); when
the split is not built, instances from ``env.generate(uniform_config(), n, seed=0)``; when env/ is unusable,
plain text prompts (the output says which). Generation is greedy with ``max_tokens`` per answer on both
backends: fp32 weights in-process; vLLM in ``--vllm-dtype`` (default: the dtype the cpu preset serves on this
machine, ``Settings.policy_dtype``) with ``--enforce-eager``; all prompts submitted at once (vLLM:
``--concurrency`` requests in flight; in-process: ``--batch-size`` prompts per ``generate``; 16 each).
Start-up (server start / weight loading) and the same warm-up on both (``--warmup`` prompts of the batch,
8 tokens each, as one batch) are timed apart and not counted in answers per second.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from env.prompt import PROMPT_STYLES, SMALL_MODEL_STYLES


def validation_prompts(n: int, style: str = "full") -> tuple[list[str], str]:
    """``n`` policy prompts and where they came from."""
    try:
        from env import load_split, render_prompt

        try:
            split = load_split("val")
            if not split:
                raise ValueError("empty split")
            # an even stride over the whole split: every grid size, not just the first ones
            instances = [split[i * len(split) // n] for i in range(min(n, len(split)))]
            sizes = sorted({getattr(i, "size", "?") for i in instances}, key=lambda v: (type(v).__name__, v))
            source = (f"env.load_split('val'), {len(instances)} of {len(split)} at a stride of "
                      f"{len(split) / max(1, len(instances)):.2f} (sizes {', '.join(map(str, sizes))})")
        except Exception as e:  # noqa: BLE001 - a missing or stale split: generate instead
            from env import generate, uniform_config

            instances = generate(uniform_config(), n, seed=0).instances[:n]
            source = f"env.generate(uniform_config(), {n}, seed=0) (val split unavailable: {type(e).__name__})"
        return [render_prompt(i, style) for i in instances], source
    except Exception as e:  # noqa: BLE001 - env not ready: the speed figure still means something
        words = ["grid", "agent", "path", "goal", "hole", "wait", "conflict", "plan"]
        prompts = [
            f"Explain in a few sentences how two agents on a {3 + i % 8}x{3 + i % 8} grid avoid a "
            f"{words[i % len(words)]} when planning paths to their goals."
            for i in range(n)
        ]
        return prompts, f"plain text prompts (env unusable: {type(e).__name__}: {e})"


def run(chat, batch, max_tokens: int) -> dict:
    t0 = time.monotonic()
    out = chat.chat_batch(batch, max_tokens=max_tokens, temperature=0.0)
    elapsed = time.monotonic() - t0
    tokens = sum(r.completion_tokens or 0 for r in out)
    return {
        "answers": len(out),
        "seconds": round(elapsed, 2),
        "answers_per_s": round(len(out) / elapsed, 3),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / elapsed, 1),
    }


def warm_up(chat, batch, n: int) -> float:
    """The same warm-up on every backend: the first ``n`` prompts as one batch, 8 tokens each; seconds."""
    t0 = time.monotonic()
    if n > 0:
        chat.chat_batch(batch[:n], max_tokens=8, temperature=0.0)
    return round(time.monotonic() - t0, 1)


def bench_vllm(model, batch, max_tokens: int, concurrency: int, log_dir: Path, warmup: int,
               dtype: str = "float32", eager: bool = True) -> dict:
    from llm_backends.vllm_server import VLLMServer

    t0 = time.monotonic()
    with VLLMServer(model, log_path=log_dir / "bench-vllm.log", dtype=dtype, enforce_eager=eager) as server:
        startup = time.monotonic() - t0
        chat = server.client(max_concurrency=concurrency)
        warm = warm_up(chat, batch, warmup)
        res = run(chat, batch, max_tokens)
    res["startup_s"] = round(startup, 1)
    res["warmup_s"] = warm
    res.update({"dtype": dtype, "eager": eager, "concurrency": concurrency})
    return res


def bench_local(model, batch, max_tokens: int, batch_size: int, warmup: int) -> dict:
    from llm_backends.local import LocalEngine

    t0 = time.monotonic()
    engine = LocalEngine(model, batch_size=batch_size)
    load = time.monotonic() - t0
    try:
        warm = warm_up(engine, batch, warmup)
        res = run(engine, batch, max_tokens)
    finally:
        engine.close()
    res["startup_s"] = round(load, 1)
    res["warmup_s"] = warm
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64, help="prompts")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per answer at most")
    p.add_argument("--batch-size", type=int, default=16, help="in-process prompts per generate call")
    p.add_argument("--concurrency", type=int, default=16, help="vLLM requests in flight")
    p.add_argument("--warmup", type=int, default=4, help="prompts of the same warm-up batch on each backend")
    p.add_argument("--log-dir", type=Path, default=Path("runs/bench"), help="vLLM server log goes here")
    p.add_argument("--only", choices=("vllm", "local"), help="bench one backend")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompt-style", default="compact", choices=PROMPT_STYLES,
                   help="policy prompt (the cpu preset's is compact; the paper's is full; moves: compact + legal moves)")
    p.add_argument("--vllm-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="vLLM weights dtype; auto: what the cpu preset serves here (Settings.policy_dtype: bfloat16 "
                        "on a CPU with bf16 hardware (AMX or AVX-512 BF16), else float32; float32 matches transformers' greedy answers)")
    p.add_argument("--compiled", action="store_true", help="vLLM without --enforce-eager (torch.compile)")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from llm_backends.models import resolve_model
    from llm_backends.vllm_server import resolve_serving_dtype, vllm_available

    if args.vllm_dtype == "auto" and vllm_available():
        args.vllm_dtype = resolve_serving_dtype("auto")
    model = resolve_model(args.model)
    prompts, source = validation_prompts(args.n, args.prompt_style)
    system = [{"role": "system", "content": ""}] if args.prompt_style in SMALL_MODEL_STYLES else []
    batch = [[*system, {"role": "user", "content": text}] for text in prompts]
    print(f"{len(batch)} {args.prompt_style} prompts from {source}; model {model.name}; max_tokens {args.max_tokens}; "
          f"greedy; vLLM {args.vllm_dtype}, {'compiled' if args.compiled else 'eager'}, {args.concurrency} in flight")
    results: dict = {"prompts": source, "n": len(batch), "max_tokens": args.max_tokens, "model": model.name,
                     "prompt_style": args.prompt_style}
    if args.only != "local":
        if vllm_available():
            results["vllm"] = bench_vllm(model, batch, args.max_tokens, args.concurrency, args.log_dir, args.warmup,
                                         dtype=args.vllm_dtype, eager=not args.compiled)
            print(f"vLLM server  : {_fmt(results['vllm'])}")
        else:
            print("vLLM server  : not installed, skipped")
    if args.only != "vllm":
        results["local"] = bench_local(model, batch, args.max_tokens, args.batch_size, args.warmup)
        print(f"in-process   : {_fmt(results['local'])}")
    for name, label in (("vllm", "vLLM server"), ("local", "in-process")):
        if name in results:
            print(f"answers/s {label:<12}: {results[name]['answers_per_s']:.3f}")
    if "vllm" in results and "local" in results:
        results["ratio_vllm_over_local"] = round(results["vllm"]["answers_per_s"] / results["local"]["answers_per_s"], 2)
        print(f"ratio vLLM / in-process answers per second: {results['ratio_vllm_over_local']}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _fmt(r: dict) -> str:
    return (
        f"{r['answers_per_s']:.3f} answers/s ({r['answers']} in {r['seconds']:.1f}s, "
        f"{r['tokens_per_s']:.0f} tok/s; start-up {r['startup_s']:.0f}s and warm-up {r['warmup_s']:.0f}s not counted)"
    )


if __name__ == "__main__":
    sys.exit(main())
