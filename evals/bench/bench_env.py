"""Speed benchmark of the MAPF-FrozenLake testbed (env/).

Run:  python evals/bench/bench_env.py [--workers 2] [--n 4000] [--build]

Prints (targets set for the 2-core dev machine):
- seconds to generate N two-agent instances from random_config(0)     (target <= 10 s for 4,000)
- answers verified per second, on a mix of correct and broken answers  (target >= 20,000 / s)
- with --build: seconds to rebuild every benchmark split into a temp dir (target <= 15 min);
  without it, the build time recorded in env/data/build.json when the committed data was built.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from env import generate, random_config, verify  # noqa: E402
from env.benchmark import DATA_DIR, build  # noqa: E402
from env.verify import plan_text  # noqa: E402


def broken(text: str, rng: random.Random) -> str:
    """Corrupt an answer the way models do: drop a step, swap agents, cut the block, garble a cell."""
    kind = rng.randrange(4)
    if kind == 0:
        return text.replace(") (", ") ", 1)
    if kind == 1:
        return text.replace("Agent 0", "Agent 9")
    if kind == 2:
        return text.split("</answer>")[0][: len(text) // 2]
    return text.replace("(", "(1", 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=None, help="default: all cores")
    ap.add_argument("--build", action="store_true", help="also time a full benchmark rebuild (minutes)")
    a = ap.parse_args()

    # Other jobs on a shared machine slow wall-clock figures; the load average says how much.
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    t0 = time.perf_counter()
    gen = generate(random_config(0), a.n, seed=0, num_agents=2, workers=a.workers)
    gen_s = time.perf_counter() - t0
    print(f"generate: {len(gen.instances)} two-agent instances from random_config(0) in {gen_s:.2f} s wall "
          f"(shortfalls {gen.stats['shortfalls']})")
    c0 = time.process_time()
    generate(random_config(0), a.n, seed=0, num_agents=2, workers=1)
    print(f"generate, one process: {time.process_time() - c0:.2f} s of CPU time")

    rng = random.Random(0)
    pairs = []
    for inst in gen.instances[:2000]:
        text = "Reasoning about the map first.\n" + plan_text(inst.plan)
        pairs.append((inst, text if rng.random() < 0.5 else broken(text, rng)))
    reps = 5
    t0 = time.perf_counter()
    c0 = time.process_time()
    valid = 0
    for _ in range(reps):
        for inst, text in pairs:
            valid += verify(inst, text).valid
    ver_s = time.perf_counter() - t0
    ver_c = time.process_time() - c0
    print(f"verify: {reps * len(pairs) / ver_s:,.0f} answers/s wall, {reps * len(pairs) / ver_c:,.0f} answers/s "
          f"of CPU time, one process ({valid / reps / len(pairs):.2f} of the answers valid)")

    if a.build:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            report = build(d, workers=a.workers, log=lambda *_: None)
            print(f"benchmark build: {time.perf_counter() - t0:.0f} s for {report['counts']}")
    else:
        info = json.loads((DATA_DIR / "build.json").read_text())
        print(f"benchmark build (recorded in env/data/build.json): {info['total_seconds']} s "
              f"for {info['counts']}")


if __name__ == "__main__":
    main()
