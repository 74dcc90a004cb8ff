"""An engineer's reply cut and asked again, in-process: the prompt's keys and values recomputed or reused.

    python -m evals.bench.bench_reask                          # a 4,400-token prompt, 16 then 64 tokens, 3 rounds
    python -m evals.bench.bench_reask --prompt-tokens 2000 --repeats 1 --json out.json

The self engineer without vLLM (`ENGINEER_SERVING=transformers`: `llm_backends.local.LocalEngine`) answers one
prompt at a time; a reply cut at its limit (`engineer_max_tokens`) is asked again with 4 times the tokens
(`llm_backends.replies.ask`). Both calls send the same prompt. Each side makes that pair of calls, greedy, with the
embedded model in float32:

- `recompute`: `LocalEngine(prompt_cache=False)`, every call runs the whole prompt;
- `reuse`: the default, the second call reuses the keys and values kept from the first.

The prompt stands in for an engineer's evidence of failures at the length the smoke loop's V1 context has (4,395
tokens with the schema): validation prompts of the testbed, joined until `--prompt-tokens`. Only its length
matters to the time. The sides alternate for `--repeats` rounds (the engine loaded once per side, outside the
timed part); medians are reported, and whether both sides gave the same replies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SIDES = {"recompute": False, "reuse": True}  # LocalEngine(prompt_cache=...)


def long_prompt(tokenizer, tokens: int) -> list[dict]:
    """Validation prompts of the testbed joined until the chat prompt holds about `tokens` tokens."""
    from env import load_split, render_prompt

    split = load_split("val")
    parts: list[str] = []
    for inst in split:
        parts.append(render_prompt(inst))
        if len(tokenizer("\n\n".join(parts))["input_ids"]) >= tokens:
            break
    return [{"role": "system", "content": "You design the next training stage. Answer with one JSON object."},
            {"role": "user", "content": "Failures of the last stage:\n\n" + "\n\n".join(parts)}]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_reask", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model path or id (default: the embedded smollm2-135m)")
    p.add_argument("--prompt-tokens", type=int, default=4400, help="prompt length in tokens (default 4400)")
    p.add_argument("--first", type=int, default=16, help="the first call's token limit (default 16; then 4x)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over both sides; the median is kept (default 3)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    a = p.parse_args(argv)
    for flag in ("prompt_tokens", "first", "repeats"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(a, flag)}: must be at least 1")

    from llm_backends.local import LocalEngine

    engines = {side: LocalEngine(a.model, batch_size=1, prompt_cache=cache) for side, cache in SIDES.items()}
    msgs = long_prompt(engines["reuse"].tokenizer, a.prompt_tokens)
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    replies: dict[str, list[str]] = {side: [] for side in SIDES}
    prompt_tokens = 0
    for r in range(a.repeats):
        # each round's prompt is one neither engine has seen: a cache kept from the round before cannot serve it
        fresh = [{**msgs[0], "content": f"{msgs[0]['content']} (round {r + 1})"}, *msgs[1:]]
        for side, eng in engines.items():
            t0 = time.perf_counter()
            first = eng.chat(fresh, max_tokens=a.first)
            t1 = time.perf_counter()
            again = eng.chat(fresh, max_tokens=a.first * 4)
            t2 = time.perf_counter()
            times[side].append((t1 - t0, t2 - t1))
            replies[side] = [first.text, again.text]
            prompt_tokens = first.prompt_tokens
            print(f"round {r + 1}/{a.repeats} {side:>9}: first {t1 - t0:.2f} s, again {t2 - t1:.2f} s", file=sys.stderr)
    for eng in engines.values():
        eng.close()
    out: dict = {"model": a.model, "prompt_tokens": prompt_tokens, "limits": [a.first, a.first * 4],
                 "repeats": a.repeats, "same_replies": replies["recompute"] == replies["reuse"], "sides": {}}
    for side, rows in times.items():
        first_s, again_s = statistics.median(t[0] for t in rows), statistics.median(t[1] for t in rows)
        out["sides"][side] = {"first_s": round(first_s, 2), "again_s": round(again_s, 2),
                              "both_s": round(statistics.median(t[0] + t[1] for t in rows), 2)}
    rc, ru = out["sides"]["recompute"], out["sides"]["reuse"]
    print(f"prompt {prompt_tokens} tokens, limits {a.first} then {a.first * 4}, medians of {a.repeats}")
    print(f"{'side':>9} | first call s | asked again s | both s")
    for side, row in out["sides"].items():
        print(f"{side:>9} | {row['first_s']:>12.2f} | {row['again_s']:>13.2f} | {row['both_s']:>6.2f}")
    print(f"asked again: {rc['again_s'] / max(ru['again_s'], 1e-9):.2f}x faster; both calls "
          f"{rc['both_s'] / max(ru['both_s'], 1e-9):.2f}x; the same replies: {out['same_replies']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
