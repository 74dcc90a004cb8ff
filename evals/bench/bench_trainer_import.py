"""How long a stage child takes to import TRL's GRPO trainer, as TRL ships it and without vLLM, side by side.

    python -m evals.bench.bench_trainer_import                # 3 rounds of each side, medians
    python -m evals.bench.bench_trainer_import --repeats 5 --json out.json

Every stage trains in a fresh Python process (`trainer.child`), which imports TRL's `GRPOTrainer` before its first
step. TRL's generation modules import vLLM at import whenever it is installed, though only `train.use_vllm=true`
generates with it. Each side is one fresh process that imports the project's trainer class the way a stage does
(`trainer.trl_cpu.grpo_trainer_class(use_vllm=False)`) and reports its wall time, its peak memory and whether vLLM
was imported:

- `shipped`: `ENV_ENGINEER_TRL_PATCH=0`, TRL as shipped (vLLM imported);
- `no_vllm`: the default (TRL's generation modules loaded as if vLLM were absent).

The sides alternate for `--repeats` rounds; the median of each is reported. `torch` and `transformers` are
imported first in both, outside the timed part, as a stage child has them by then.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDES = {"shipped": "0", "no_vllm": "1"}  # ENV_ENGINEER_TRL_PATCH
PROBE = """
import json, resource, sys, time
import torch, transformers
t = time.perf_counter()
from trainer.trl_cpu import grpo_trainer_class
grpo_trainer_class(use_vllm=False)
s = time.perf_counter() - t
print(json.dumps({"import_s": s, "vllm_imported": "vllm" in sys.modules,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def probe(patch: str) -> dict:
    env = {**os.environ, "ENV_ENGINEER_TRL_PATCH": patch,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_trainer_import: the probe failed (ENV_ENGINEER_TRL_PATCH={patch}):\n"
                         f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_trainer_import", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="rounds over both sides; the median is kept (default 3)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: must be at least 1")
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(a.repeats):
        for side, patch in SIDES.items():
            runs[side].append(probe(patch))
            print(f"round {r + 1}/{a.repeats} {side:>8}: {runs[side][-1]['import_s']:.2f} s", file=sys.stderr)
    out = {"repeats": a.repeats, "sides": {}}
    for side, rows in runs.items():
        out["sides"][side] = {
            "import_s": round(statistics.median(x["import_s"] for x in rows), 2),
            "peak_rss_mb": round(statistics.median(x["peak_rss_mb"] for x in rows)),
            "vllm_imported": all(x["vllm_imported"] for x in rows),
            "all_s": [round(x["import_s"], 2) for x in rows],
        }
    sh, nv = out["sides"]["shipped"], out["sides"]["no_vllm"]
    out["saved_s"] = round(sh["import_s"] - nv["import_s"], 2)
    print(f"{'side':>8} | import s (median of {a.repeats}) | peak RSS MB | vLLM imported")
    for side, row in out["sides"].items():
        print(f"{side:>8} | {row['import_s']:>26.2f} | {row['peak_rss_mb']:>11} | {row['vllm_imported']}")
    print(f"saved per stage child: {out['saved_s']:.2f} s ({sh['import_s'] / max(nv['import_s'], 1e-9):.2f}x faster "
          "import)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
