"""Does a kept vLLM server answer like a fresh one after its weights are reloaded in place, and how repeatable
are greedy answers on one server?

    python -m evals.bench.bench_reload --before RUN/stage_1/checkpoint --after RUN/stage_2/checkpoint

A run with ``keep_server`` evaluates stage k+1 on the server it started for stage k, after
``VLLMServer.reload_weights`` (and a prefix-cache reset). This bench replays that on one split, greedy, with
the cpu preset's prompt (``compact``), token cap and serving (bfloat16, LoRA enabled, 64 answers in flight):

1. a server started on ``--before`` answers the split (its prefix cache now holds every prompt);
2. the same server reloads ``--after`` and answers again;
3. a fresh server started on ``--after`` answers twice.

It prints each pass's valid count and how many answers are the same text as the fresh server's first pass.
"after reload" matching "fresh" about as often as "fresh, asked again" does means the reload serves the new
weights; "fresh, asked again" below n measures how far greedy answers on one server are from repeatable.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="weights the kept server starts on (stage k)")
    p.add_argument("--after", type=Path, required=True, help="weights reloaded in place (stage k+1)")
    p.add_argument("--split", default="val-small", help="benchmark split (default val-small, the cpu preset's)")
    p.add_argument("--n", type=int, default=None, help="first N instances of the split (default: all)")
    p.add_argument("--max-tokens", type=int, default=160, help="tokens per answer (the cpu preset's eval_max_tokens)")
    p.add_argument("--batch", type=int, default=64, help="answers in flight (the cpu preset's eval_batch_size)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures and every answer here")
    p.add_argument("--log-dir", type=Path, default=Path("logs"), help="vLLM server logs")
    args = p.parse_args(argv)
    for flag, path in (("--before", args.before), ("--after", args.after)):
        if not (path / "config.json").is_file():
            p.error(f"{flag} {path}: not a checkpoint folder (no config.json); allowed: a saved model folder")
    if args.n is not None and args.n < 1:
        p.error(f"--n {args.n}: allowed: 1 or more instances")

    from env import load_split
    from llm_backends.policy import open_policy, stop_kept_server
    from nodes.evaluate import answer_and_verify

    instances = load_split(args.split)[: args.n]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(instances)} instances of {args.split}; greedy, compact prompt, {args.max_tokens} tokens, "
          f"{args.batch} in flight, bfloat16")

    def ask(weights, tag):
        # the run's own kept-server path: the first call starts it, a call with other weights reloads them
        with open_policy(weights, "vllm", args.log_dir, max_concurrency=args.batch, keep_server=True,
                         dtype="bfloat16") as chat:
            return answer_and_verify(instances, chat, max_tokens=args.max_tokens, batch_size=args.batch,
                                     desc=tag, prompt_style="compact")

    passes: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    try:
        passes["before (kept server)"] = ask(args.before, "before")
        passes["after reload"] = ask(args.after, "after reload")
        stop_kept_server()  # the next call starts a fresh kept server on --after
        passes["after, fresh server"] = ask(args.after, "fresh")
        passes["after, fresh, asked again"] = ask(args.after, "fresh again")
    finally:
        stop_kept_server()
    ref = passes["after, fresh server"]
    n = len(ref)
    print(f"\n{'pass':<28}{'valid':>10}{'same text as fresh':>22}{'same verdict':>15}")
    summary = {}
    for name, rows in passes.items():
        k = sum(r["valid"] for r in rows)
        same = sum(a["text"] == b["text"] for a, b in zip(ref, rows, strict=True))
        verdict = sum(a["valid"] == b["valid"] for a, b in zip(ref, rows, strict=True))
        print(f"{name:<28}{f'{k}/{n}':>10}{f'{same}/{n}':>22}{f'{verdict}/{n}':>15}")
        summary[name] = {"valid": k, "n": n, "same_text_as_fresh": same, "same_verdict_as_fresh": verdict}
    print(f"({time.monotonic() - t0:.0f} s in all, server starts included)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "before": str(args.before), "after": str(args.after), "split": args.split, "n": n,
            "max_tokens": args.max_tokens, "batch": args.batch, "summary": summary,
            "answers": {name: [{"id": r["id"], "valid": r["valid"], "text": r["text"]} for r in rows]
                        for name, rows in passes.items()},
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
