"""GRPO's sampler on this CPU: generated tokens per second of each rollout path, side by side in one run.

    python -m evals.bench.bench_rollout                       # the cpu preset's batch: 2 prompts x 8 completions
    python -m evals.bench.bench_rollout --rows 8 --new-tokens 64 --repeats 2

Every path answers the same left-padded batch of policy prompts (compact prompt, 3x3 and 4x4 maps) with
`--new-tokens` tokens per row (EOS suppressed, so each path does exactly the same work), in `model.generate`
the way TRL's transformers path calls it. The paths, each an addition to the one before:

- `fp32`: the trained float32 model itself (the sampler before the CPU speed work);
- `bf16`: a bf16 copy of its weights (`RolloutCopy`);
- `bf16+gqa`: the copy's attention passes GQA to torch's CPU kernel instead of repeating the KV heads;
- `bf16+gqa+cache`: and its KV cache grows into spare room instead of being concatenated every token;
- `rollout-flash`: `trainer.grpo_trainer.RolloutCopy` before its decode matmuls: all of the above, each distinct
  prompt prefilled once (TRL repeats every prompt once per completion), and sampled tokens drawn by inverse CDF
  instead of `torch.multinomial` (the same distribution, one uniform variate per row instead of an exponential
  variate per vocabulary entry);
- `rollout-qk`: and each decode step's attention as two grouped matmuls instead of torch's bf16 CPU kernel
  (`_decode_attention`), its scores as queries times the transposed keys;
- `rollout`: `RolloutCopy` as it stands: the scores as keys times the queries instead, which spares the batched
  matmul a copy of the transposed view of the cache's buffer;
- `rollout-fp32`: `RolloutCopy` in float32: every lever above but bf16 (`train.rollout_dtype=float32`, what `auto`
  picks on a CPU without bf16 hardware, where bf16 is multiplied in software), its linears on MKL's matmul;
- `rollout-fp32-packed`: and its linears on weights packed once for oneDNN (`train.rollout_prepack`, what a float32
  copy does by default: `trainer.rollout_linear.prepack_linears`).

Tokens are sampled at `--temperature` (0.7, the cpu preset's) through a `GenerationConfig`, as TRL calls it;
`--greedy` decodes greedily instead, and then every path's answers are compared token for token with the first
path of its dtype's (float32 copy against float32 model, bf16 paths against the first bf16 one): GQA and the cache change how attention is computed, not what. The shared prefill runs a batch of
another shape, which bf16 rounds differently, so `rollout`'s greedy tokens may part from the others' after a near
tie (in float32 they are equal: tests/test_grpo_rollout.py). The runs alternate between paths (`--repeats`
rounds) and the median is reported.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

PATHS = ("fp32", "bf16", "bf16+gqa", "bf16+gqa+cache", "rollout-flash", "rollout-qk", "rollout", "rollout-fp32",
         "rollout-fp32-packed")
FP32_PATHS = ("fp32", "rollout-fp32", "rollout-fp32-packed")  # the rest sample in bf16


def build(model, path: str):
    """The sampler of `path`; the last one is `RolloutCopy` itself, the others stop part of the way."""
    import torch

    from trainer.grpo_trainer import RolloutCopy
    from trainer.rollout_attention import use_gqa_sdpa

    if path == "fp32":
        return model
    if path in ("rollout-fp32", "rollout-fp32-packed"):
        return RolloutCopy(torch.float32, prepack=path.endswith("packed")).synced(model, step=0)
    if path in ("bf16+gqa+cache", "rollout-flash", "rollout-qk", "rollout"):
        m = RolloutCopy(torch.bfloat16).synced(model, step=0)
        if path == "rollout-qk":
            use_gqa_sdpa(m, keys_first=False)  # queries times transposed keys, as first written
        elif path != "rollout":
            use_gqa_sdpa(m, decode_matmul=False)  # torch's kernel for decode steps too
        if path == "bf16+gqa+cache":
            m.__dict__.pop("generate")  # transformers' own generate: torch.multinomial draws the sampled tokens
        return m
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.data = p.data.to(torch.bfloat16)
    if "gqa" in path:
        use_gqa_sdpa(m, decode_matmul=False)
    return m


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_rollout", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model path or id (default: the embedded smollm2-135m)")
    p.add_argument("--rows", type=int, default=16, help="completions per generate call (default 16: 2 x 8)")
    p.add_argument("--groups", type=int, default=2, help="distinct prompts in the batch (default 2)")
    p.add_argument("--new-tokens", type=int, default=96, help="tokens generated per row (default 96)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all paths; the median is kept (default 3)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma list among {', '.join(PATHS)}")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="sampling temperature (default 0.7, the cpu preset's)")
    p.add_argument("--greedy", action="store_true", help="decode greedily, and compare the bf16 paths' tokens")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    a = p.parse_args(argv)
    paths = [s.strip() for s in a.paths.split(",") if s.strip()]
    bad = [s for s in paths if s not in PATHS]
    if bad or not paths:
        p.error(f"--paths {a.paths!r}: allowed: {', '.join(PATHS)}")
    for flag in ("rows", "groups", "new_tokens", "repeats"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(a, flag)}: must be at least 1")
    if not a.temperature > 0:
        p.error(f"--temperature {a.temperature}: must be above 0")
    if a.rows % a.groups:
        p.error(f"--rows {a.rows} is not a multiple of --groups {a.groups}")

    import torch

    from env.library import prompt_messages
    from env.task import MapfTask
    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model

    model, tok = load_checkpoint(resolve_model(a.model), trainable=False)
    model.eval()
    tok.padding_side = "left"
    insts = MapfTask().warm_start_items([3, 4], a.groups, 0)
    texts = [tok.apply_chat_template(prompt_messages(i, "compact"), tokenize=False, add_generation_prompt=True)
             for i in insts]
    enc = tok([t for t in texts for _ in range(a.rows // a.groups)], return_tensors="pt", padding=True)
    from transformers import GenerationConfig

    torch.manual_seed(0)
    sampling = dict(do_sample=False) if a.greedy else dict(do_sample=True, temperature=a.temperature, top_k=0)
    gen = dict(generation_config=GenerationConfig(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                                  pad_token_id=tok.pad_token_id, **sampling))
    models = {path: build(model, path) for path in paths}
    width = max(len(path) for path in paths) + 1
    times: dict[str, list[float]] = {path: [] for path in paths}
    answers = {}
    print(f"{a.rows} rows ({a.groups} prompts, {enc.input_ids.shape[1]} prompt tokens padded), {a.new_tokens} new "
          f"tokens each, {'greedy' if a.greedy else f'sampled at T {a.temperature}'}, {torch.get_num_threads()} "
          f"threads, {a.repeats} rounds", flush=True)
    for r in range(a.repeats):
        for path in paths:
            t = time.perf_counter()
            with torch.no_grad():
                out = models[path].generate(**enc, **gen)
            times[path].append(time.perf_counter() - t)
            answers[path] = out
            print(f"  round {r + 1} {path:<{width}} {times[path][-1]:6.2f} s", flush=True)
    base = statistics.median(times[paths[0]])
    rows = {}
    for path in paths:
        s = statistics.median(times[path])
        rows[path] = {"seconds": round(s, 3), "tokens_per_s": round(a.rows * a.new_tokens / s, 1),
                      f"speedup_vs_{paths[0]}": round(base / s, 2)}
    # greedy: each path's tokens against the first path of its dtype (float32 paths in float32 are equal)
    refs = {}
    for path in paths:
        refs.setdefault(path in FP32_PATHS, path)
    same = {p: {"as": refs[p in FP32_PATHS], "equal": bool(torch.equal(answers[p], answers[refs[p in FP32_PATHS]]))}
            for p in paths if a.greedy and p != refs[p in FP32_PATHS]}
    head = "x " + paths[0]
    print(f"\n{'path':<{width}}{'median s':>10}{'tok/s':>9}  {head:>{len(head)}}")
    for path, row in rows.items():
        print(f"{path:<{width}}{row['seconds']:>10.2f}{row['tokens_per_s']:>9.1f}  "
              f"{row[f'speedup_vs_{paths[0]}']:>{len(head)}.2f}")
    if same:
        print("greedy tokens equal: " + ", ".join(f"{p} to {v['as']} {v['equal']}" for p, v in same.items()))
    result = {"rows": a.rows, "groups": a.groups, "new_tokens": a.new_tokens,
              "decoding": "greedy" if a.greedy else f"sampled, T {a.temperature}",
              "prompt_tokens_padded": int(enc.input_ids.shape[1]), "threads": torch.get_num_threads(),
              "repeats": a.repeats, "paths": rows, "same_greedy_tokens": same,
              "command": "python -m evals.bench.bench_rollout " + " ".join(argv or [])}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
