"""Does vLLM in bfloat16 score the same policy as the fp32 model training produces? Greedy answers compared.

    python -m evals.bench.bench_agreement                          # the cached cpu warm start, 150 val-small
    python -m evals.bench.bench_agreement --checkpoint DIR --n 50  # any checkpoint, fewer instances

The cpu preset's per-stage evaluation answers through a vLLM server. Serving in bfloat16 is several times
faster than float32 on a CPU with AMX (bench_llm), but bf16 rounds the weights, so greedy answers can differ
from the fp32 policy that training produced. This bench answers the same instances, greedy, with the run's
own prompt (``compact``) and token cap, three ways: in-process transformers fp32 (the reference: the
policy as trained), vLLM fp32 (the preset's old serving) and vLLM bf16. It prints, per backend: the valid
and optimal rate with a Wilson 95 % interval, how many answers are the same text as the reference, how many
get the same verdict (valid/invalid), and the paired difference in valid rate with its Student-t 95 % interval (`evals.stats`).
A serving dtype is fit for the per-stage evaluation when its verdicts agree with the reference about as
often as vLLM fp32's do and its valid rate is within the evaluation's noise.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def answer(instances, backend: str, checkpoint: str, dtype: str, max_tokens: int, batch: int, log_dir: Path):
    from nodes.evaluate import answer_and_verify

    t0 = time.monotonic()
    if backend == "transformers":
        from llm_backends.local import LocalEngine

        with LocalEngine(checkpoint, batch_size=batch) as chat:
            rows = answer_and_verify(instances, chat, max_tokens=max_tokens, batch_size=batch,
                                     desc=f"{backend} {dtype}", prompt_style="compact")
    else:
        from llm_backends.vllm_server import VLLMServer

        with VLLMServer(checkpoint, log_path=log_dir / f"vllm-{dtype}.log", dtype=dtype) as server:
            chat = server.client(max_concurrency=batch)
            try:
                t0 = time.monotonic()  # answers only, as in bench_llm: server start-up is not counted
                rows = answer_and_verify(instances, chat, max_tokens=max_tokens, batch_size=batch,
                                         desc=f"{backend} {dtype}", prompt_style="compact")
            finally:
                chat.close()
    return rows, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    from env import load_split
    from evals.stats import mean_ci, wilson

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None,
                   help="policy weights (default: the cached warm start of the cpu preset, built if missing)")
    p.add_argument("--split", default="val-small", help="benchmark split (default val-small, the cpu preset's)")
    p.add_argument("--n", type=int, default=None, help="first N instances of the split (default: all)")
    p.add_argument("--max-tokens", type=int, default=160, help="tokens per answer (the cpu preset's eval_max_tokens)")
    p.add_argument("--batch", type=int, default=64, help="answers in flight / per in-process batch")
    p.add_argument("--json", type=Path, default=None, help="also write the figures and every verdict here")
    p.add_argument("--log-dir", type=Path, default=Path("logs"), help="vLLM server logs")
    args = p.parse_args(argv)
    if args.n is not None and args.n < 2:
        p.error(f"--n {args.n}: allowed: 2 or more instances (the paired difference needs an interval)")

    checkpoint = args.checkpoint
    if checkpoint is None:
        from graph.settings import build_settings  # the cpu preset's own warm-start settings and cache key
        from llm_backends.models import resolve_model
        from trainer.sft import build_warm_start, warm_start_levels

        settings = build_settings({"preset": "cpu"}, env={})
        checkpoint = build_warm_start(resolve_model(settings.policy_model), settings.train, settings.seed,
                                      warm_start_levels(settings.task, settings.train), task=settings.task)["path"]
    instances = load_split(args.split)[: args.n]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(instances)} instances of {args.split}; checkpoint {checkpoint}; greedy, compact prompt, "
          f"{args.max_tokens} tokens, {args.batch} in flight")

    runs = {}
    for backend, dtype in (("transformers", "float32"), ("vllm", "float32"), ("vllm", "bfloat16")):
        rows, secs = answer(instances, backend, checkpoint, dtype, args.max_tokens, args.batch, args.log_dir)
        runs[f"{backend} {dtype}"] = {"rows": rows, "seconds": secs}

    ref = runs["transformers float32"]["rows"]
    print(f"\n{'backend':<22}{'valid %':>20}{'optimal %':>11}{'same text':>11}{'same verdict':>14}"
          f"{'valid - ref (pts, 95% CI)':>30}{'answers/s':>11}")
    summary = {}
    for name, run in runs.items():
        rows, n = run["rows"], len(run["rows"])
        k = sum(r["valid"] for r in rows)
        lo, hi = wilson(k, n)
        opt = sum(bool(r.get("optimal")) for r in rows)
        same_text = sum(a["text"] == b["text"] for a, b in zip(ref, rows, strict=True))
        same_verdict = sum(a["valid"] == b["valid"] for a, b in zip(ref, rows, strict=True))
        paired = mean_ci([int(b["valid"]) - int(a["valid"]) for a, b in zip(ref, rows, strict=True)])
        d, dlo, dhi = paired["mean"], paired["low"], paired["high"]
        rate = n / run["seconds"]
        print(f"{name:<22}{f'{100 * k / n:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]':>20}{100 * opt / n:>11.1f}"
              f"{f'{same_text}/{n}':>11}{f'{same_verdict}/{n}':>14}"
              f"{f'{100 * d:+.1f} [{100 * dlo:+.1f}, {100 * dhi:+.1f}]':>30}{rate:>11.2f}")
        summary[name] = {"valid": k, "n": n, "optimal": opt, "same_text": same_text,
                         "same_verdict": same_verdict, "valid_diff_pts": [100 * d, 100 * dlo, 100 * dhi],
                         "answers_per_s": rate}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "checkpoint": checkpoint, "split": args.split, "n": len(instances), "max_tokens": args.max_tokens,
            "summary": summary,
            "verdicts": {name: [{"id": r["id"], "valid": r["valid"], "failure": r.get("failure"), "text": r["text"]}
                                for r in run["rows"]] for name, run in runs.items()},
        }, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
