"""TRL's fused LM head on this CPU, forward and backward, as shipped and in CPU-sized tiles, side by side in one run.

    python -m evals.bench.bench_head                 # a cpu-preset GRPO step's rows: 16 completions x 108 tokens
    python -m evals.bench.bench_head --rows 480      # an SFT step's: 8 answers x 60 tokens

Both sides run `trl.kernels.ChunkedLogProbFunction` (what `trl.trainer.utils.add_fused_lm_head` calls in GRPO and
SFT) on the embedded model's LM head (the tied embedding, frozen as the cpu preset freezes it) and the same random
hidden states and targets, with the log-probs and entropies GRPO asks for, and the backward of a weighted sum of
the log-probs (an advantage per row, as GRPO's loss):

- `trl`: TRL as shipped, 4096 rows x 32,768 vocabulary columns per tile;
- `tiled`: `trainer.trl_cpu.tile_head_on_cpu`'s tiles (`CPU_HEAD_ROWS` x `CPU_HEAD_VOCAB`).

The sides alternate for `--repeats` rounds and the median is reported, with the largest difference between the
two sides' log-probs, entropies and hidden-state gradients.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_head", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model path or id (default: the embedded smollm2-135m)")
    p.add_argument("--rows", type=int, default=16 * 108,
                   help="token rows scored (default 1728: 16 completions x 108 tokens)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over both sides; the median is kept (default 3)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    a = p.parse_args(argv)
    for flag in ("rows", "repeats"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} {getattr(a, flag)}: must be at least 1")

    import torch
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.trl_cpu import CPU_HEAD_ROWS, CPU_HEAD_VOCAB, _CpuTiledHead

    model, _ = load_checkpoint(resolve_model(a.model), trainable=False)
    weight = model.get_output_embeddings().weight.detach()
    del model
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(a.rows, weight.shape[1], generator=g) * 2.0
    targets = torch.randint(0, weight.shape[0], (a.rows,), generator=g)
    advantage = torch.randn(a.rows, generator=g)
    sides = {"trl": ChunkedLogProbFunction, "tiled": _CpuTiledHead(ChunkedLogProbFunction)}

    def run(fn):
        h = hidden.clone().requires_grad_(True)
        t = time.perf_counter()
        logps, entropy, *_ = fn.apply(h, weight, None, targets, 0.7, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0,
                                      ("entropy",))
        (logps * advantage).sum().backward()
        return time.perf_counter() - t, logps.detach(), entropy.detach(), h.grad

    print(f"{a.rows} rows x {weight.shape[0]} vocabulary, hidden {weight.shape[1]}, {torch.get_num_threads()} threads, "
          f"{a.repeats} rounds; tiles: trl 4096 x {_CHUNKED_LOGPROB_CHUNK_SIZE}, tiled {CPU_HEAD_ROWS} x "
          f"{CPU_HEAD_VOCAB}", flush=True)
    for fn in sides.values():  # first allocations, untimed
        run(fn)
    times: dict[str, list[float]] = {s: [] for s in sides}
    out = {}
    for r in range(a.repeats):
        for side, fn in sides.items():
            sec, *out[side] = run(fn)
            times[side].append(sec)
            print(f"  round {r + 1} {side:<6} {sec:6.2f} s", flush=True)
    med = {s: statistics.median(v) for s, v in times.items()}
    diff = {name: float((x - y).abs().max()) for name, x, y in zip(("log_probs", "entropy", "hidden_grad"),
                                                                     out["trl"], out["tiled"], strict=True)}
    print(f"\nforward + backward, median: trl {med['trl']:.2f} s, tiled {med['tiled']:.2f} s: "
          f"{med['trl'] / med['tiled']:.2f}x")
    print("largest difference: " + ", ".join(f"{k} {v:.1e}" for k, v in diff.items()))
    result = {"rows": a.rows, "vocab": int(weight.shape[0]), "threads": torch.get_num_threads(), "repeats": a.repeats,
              "tiles": {"trl": [4096, _CHUNKED_LOGPROB_CHUNK_SIZE], "tiled": [CPU_HEAD_ROWS, CPU_HEAD_VOCAB]},
              "seconds": times, "median": med, "speedup": med["trl"] / med["tiled"], "max_abs_diff": diff,
              "command": "python -m evals.bench.bench_head " + " ".join(argv or [])}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
