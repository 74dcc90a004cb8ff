"""How long does a reasoning-gym task take to load and to generate its first stage? Seconds per dataset, cold (no
cached splits) and warm (the splits cached by the first load), on this machine.

    python -m evals.bench.bench_rg_load bf futoshiki jugs puzzle24 zebra_puzzles
    python -m evals.bench.bench_rg_load --all --top 5     # every curriculum dataset, the 5 slowest printed

"warm" is a second load against the cache the first one left (after a cold load cut by `--timeout`: the levels it
finished are kept, so the second load resumes).

A task's load is `trainer.task.load_task("rg:<name>")`; its first stage is `task.generate` of `--instances`
questions from its random stage-0 config (which needs the fixed splits, to keep the stage's questions out of them).
Each dataset is timed in a fresh child process, so that no import or cache in memory carries over. The figures
depend on the machine and what else runs on it: say which when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from trainer.task import load_task
t1 = time.perf_counter()
task = load_task(sys.argv[1])
t2 = time.perf_counter()
cfg = task.random_config(0, int(sys.argv[2]))
items, _ = task.generate(cfg, int(sys.argv[2]), seed=0)
t3 = time.perf_counter()
print("\\n" + json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_stage_s": t3 - t2, "levels": len(task.levels),
                  "items": len(items)}))  # on a line of its own: a generator may print (bf prints dots)
"""


def time_one(name: str, instances: int, cache: str, timeout: float) -> dict:
    env = {**os.environ, "ENV_ENGINEER_CACHE": cache}
    t = time.perf_counter()
    # its own session, so that a timeout stops the child's forked level checks with it
    proc = subprocess.Popen([sys.executable, "-c", CHILD, f"rg:{name}", str(instances)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"over {timeout:g} s", "total_s": time.perf_counter() - t}
    if proc.returncode != 0:
        return {"error": (err.strip().splitlines() or ["?"])[-1][:160], "total_s": time.perf_counter() - t}
    row = json.loads(out.strip().splitlines()[-1])
    row["total_s"] = row["load_s"] + row["first_stage_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_rg_load", description=__doc__.split("\n\n")[0])
    p.add_argument("datasets", nargs="*", help="reasoning-gym dataset names (without rg:)")
    p.add_argument("--all", action="store_true", help="every dataset with a curriculum")
    p.add_argument("--top", type=int, default=0, help="print only the N slowest (cold)")
    p.add_argument("--instances", type=int, default=64, help="questions in the first stage (default 64)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before a dataset counts as too slow")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--cache", default=None, help="the cache folder to time against (default: a fresh one, removed "
                   "after); a cold load cut by --timeout keeps the levels it finished there")
    a = p.parse_args(argv)
    names = list(a.datasets)
    if a.all:
        from reasoning_gym.factory import CURRICULA

        names = sorted(CURRICULA)
    if not names:
        p.error("name at least one dataset, or --all")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = a.cache or tmp
        for name in names:
            cold = time_one(name, a.instances, cache, a.timeout)
            warm = time_one(name, a.instances, cache, a.timeout)
            rows[name] = {"cold": cold, "warm": warm}
            print(f"{name:28s} cold {fmt(cold)}  warm {fmt(warm)}", file=sys.stderr, flush=True)
    order = sorted(rows, key=lambda n: -rows[n]["cold"]["total_s"])
    if a.top:
        order = order[:a.top]
    print(f"{'dataset':28s} {'levels':>6s} {'load s':>8s} {'stage s':>8s} {'total s':>8s}  warm total s")
    for n in order:
        c, w = rows[n]["cold"], rows[n]["warm"]
        warm = f"error: {w['error']}" if "error" in w else f"{w['total_s']:.1f} ({w['levels']} levels)"
        if "error" in c:
            print(f"{n:28s} {'':6s} {'':8s} {'':8s} {c['total_s']:8.1f}  cold error: {c['error']}; warm {warm}")
            continue
        print(f"{n:28s} {c['levels']:6d} {c['load_s']:8.1f} {c['first_stage_s']:8.1f} {c['total_s']:8.1f}  {warm}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def fmt(r: dict) -> str:
    if not r:
        return "-"
    if "error" in r:
        return f"error ({r['error']})"
    return f"{r['total_s']:.1f} s ({r['levels']} levels)"


if __name__ == "__main__":
    raise SystemExit(main())
