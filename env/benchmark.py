"""The fixed evaluation sets, built once from fixed seeds and committed under env/data/ with checksums.

Splits (`list_splits()`):

- ``val``: the 2-agent validation set the loop evaluates on after every stage: 25 instances for each
  size 3..10 (200), hole ratios cycling 0.1, 0.2, ..., 0.5 (capped by `max_hole_ratio`), half of each
  size asked to need a wait.
- ``val-mini``: the first 8 ``val`` instances of sizes 3, 4 and 5 (24), for CPU runs.
- ``val-small``: 2 agents, sizes 3, 4 and 5 x 50 (150), drawn like ``val`` from a seed of its own: the
  per-stage evaluation of CPU runs, where a 135M policy learns on small maps. 150 answers resolve a change
  of about 5 points in the valid rate where ``val-mini``'s 24 cannot.
- ``test``: the held-out suite in the paper's protocol: 3 agents on sizes 3..10, 4 agents on 4..10 and
  5 agents on 5..10 (the paper's cells: size >= agents), 150 instances per (agents, size) cell, 50 per
  wait ratio 0.25 / 0.50 / 0.75 (3,150 in all); hole ratios cycling 0.1..0.5 within each size (capped by
  `max_hole_ratio(size, agents)`). Each instance has ``tags`` {"agents", "wait", "hole"}. Where a subset
  cannot reach its wait ratio, the shortfall is recorded in ``env/data/build.json``.
- ``test-extra``: the cells outside the paper's protocol, drawn with the same seeds: 4 agents on 3x3 and
  5 agents on 3x3 and 4x4 (450). Until env 1.1.0 they were part of ``test``.
- ``test-mini``: one ``test`` instance per (agents, wait, size) stratum (63), for CPU runs.
- ``test-cpu``: held out at CPU scale, where a 135M policy is not at 0: 2 and 3 agents x wait ratio
  0.25 / 0.50 / 0.75 x sizes 3, 4, 5 x 50 (150 per (agents, size) column, 900 in all), from a seed of its own.

Every instance stores both optima, each from an exact search: ``optimal_cost`` (sum of costs) and
``optimal_makespan`` (the latest arrival; the paper's "makespan-optimal"). The held-out splits search the
makespan with a budget of `BENCH_MAKESPAN_NODES` CBS nodes per draw, so ``test`` and ``test-extra`` keep
the instances of env 1.0.0 with one field more, but one: test-a5-w75-s8-24 passed the budget and was
redrawn from its seed (its next draw). On 402 of the 3,974 instances of env 1.0.0 the optimal makespan is
shorter than the makespan of the stored sum-of-costs plan.

Every file's sha256 is in ``env/data/checksums.sha256`` and is checked on load; a mismatch raises
`BenchmarkIntegrityError`. Rebuilding is a deliberate act: ``python -m env benchmark --build``.
"""

from __future__ import annotations

import hashlib
import json
import time
from functools import lru_cache
from pathlib import Path

from .config import SIZES, max_hole_ratio
from .generator import run_tasks, slot_seed
from .instance import Instance, atomic_write_lines, read_jsonl

DATA_DIR = Path(__file__).parent / "data"
CHECKSUMS = "checksums.sha256"  # .sha256 so pyproject's package-data ships it
VAL_SEED = 1001
TEST_SEED = 2002
VAL_PER_SIZE = 25
VAL_MINI_SIZES = (3, 4, 5)
VAL_MINI_PER_SIZE = 8
VAL_SMALL_SEED = 1003
VAL_SMALL_SIZES = (3, 4, 5)
VAL_SMALL_PER_SIZE = 50
TEST_AGENTS = (3, 4, 5)
TEST_WAITS = (0.25, 0.5, 0.75)
TEST_PER_SIZE = 50
HOLE_CYCLE = (0.1, 0.2, 0.3, 0.4, 0.5)
TEST_MAX_TRIES = 40
TEST_CPU_SEED = 2003
TEST_CPU_AGENTS = (2, 3)
TEST_CPU_SIZES = (3, 4, 5)
BENCH_MAKESPAN_NODES = 300_000  # optimal-makespan search budget per held-out draw (a draw past it is redrawn)


def paper_cell(agents: int, size: int) -> bool:
    """The paper's held-out cells: 3 agents on 3x3-10x10, 4 on 4x4-10x10, 5 on 5x5-10x10 (size >= agents)."""
    return size >= agents


SPLITS = {
    "val": "2 agents, sizes 3..10 x 25 (200), hole ratios 0.1-0.5, half need a wait",
    "val-mini": "2 agents, first 8 val instances of sizes 3, 4, 5 (24)",
    "val-small": "2 agents, sizes 3, 4, 5 x 50 (150), own seed: the per-stage evaluation of CPU runs",
    "test": "held-out, the paper's protocol: 3 agents x sizes 3..10, 4 x 4..10, 5 x 5..10; 150 per cell (50 per "
            "wait ratio 0.25/0.50/0.75), hole ratios 0.1-0.5 (3,150)",
    "test-extra": "held-out cells outside the paper's protocol: 4 agents on 3x3, 5 agents on 3x3 and 4x4 (450)",
    "test-mini": "one test instance per (agents, wait, size) stratum (63)",
    "test-cpu": "held-out at CPU scale: 2 and 3 agents x wait 0.25/0.50/0.75 x sizes 3, 4, 5 x 50 (900), own seed",
}


class BenchmarkIntegrityError(ValueError):
    """A committed benchmark file does not match its recorded checksum."""


def list_splits() -> dict[str, str]:
    """Split name -> one-line description."""
    return dict(SPLITS)


def split_info(name: str, data_dir: str | Path | None = None) -> dict:
    """What `python -m env benchmark --list` shows for a split: ``count``, ``sizes`` and ``agents`` (sorted),
    the file's ``sha256`` (checked against checksums.sha256), and ``error`` (None, or why the split cannot
    be loaded: missing file or checksum mismatch)."""
    try:
        insts = load_split(name, data_dir)
    except (BenchmarkIntegrityError, OSError) as e:
        return {"count": 0, "sizes": [], "agents": [], "sha256": "", "error": str(e).split(";")[0]}
    path = Path(data_dir or DATA_DIR) / f"{name}.jsonl"
    return {"count": len(insts), "sizes": sorted({i.size for i in insts}),
            "agents": sorted({i.num_agents for i in insts}), "sha256": sha256_file(path), "error": None}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read_checksums(data_dir: Path) -> dict[str, str]:
    path = data_dir / CHECKSUMS
    if not path.exists():
        raise BenchmarkIntegrityError(f"{path} is missing; the benchmark data cannot be verified")
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.strip()] = digest
    return out


def load_split(name: str, data_dir: str | Path | None = None) -> list[Instance]:
    """Load a split by name after checking its sha256 against ``checksums.sha256``."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
    d = Path(data_dir or DATA_DIR)
    path = d / f"{name}.jsonl"
    if not path.exists():
        raise BenchmarkIntegrityError(f"{path} is missing; rebuild with `python -m env benchmark --build`")
    # The cache key includes the files' size and mtime, so a file changed on disk is re-checked.
    stamp = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in (path, d / CHECKSUMS) if p.exists())
    return list(_load(name, str(d), stamp))


@lru_cache(maxsize=16)
def _load(name: str, data_dir: str, stamp: tuple) -> tuple[Instance, ...]:
    d = Path(data_dir)
    path = d / f"{name}.jsonl"
    expected = _read_checksums(d).get(path.name)
    actual = sha256_file(path)
    if expected != actual:
        raise BenchmarkIntegrityError(
            f"{path}: sha256 {actual[:16]}... does not match checksums.sha256 ({(expected or 'none')[:16]}...); "
            "the committed benchmark was modified: restore it from git, or rebuild it deliberately with "
            "`python -m env benchmark --build`"
        )
    return tuple(read_jsonl(path, unique_ids=True))  # verdicts, journals and paired stats key rows by id


# ----------------------------------------------------------------------------------------------------
# Building (once; the result is committed)


def _spread(j: int, n: int, w: float) -> bool:
    want = int(w * n + 0.5)
    return (j + 1) * want // n > j * want // n


def val_tasks(sizes=SIZES, per_size: int = VAL_PER_SIZE, seed: int = VAL_SEED, prefix: str = "val") -> list[tuple]:
    """2-agent tasks: `per_size` per size, hole ratios cycling, half of each size asked to need a wait."""
    tasks = []
    for s in sizes:
        for j in range(per_size):
            idx = len(tasks)
            hole = min(HOLE_CYCLE[j % len(HOLE_CYCLE)], max_hole_ratio(s, 2))
            tasks.append((idx, s, hole, _spread(j, per_size, 0.5), 2, slot_seed(seed, idx),
                          TEST_MAX_TRIES, f"{prefix}-s{s}-{j:02d}"))
    return tasks


def val_small_tasks() -> list[tuple]:
    return val_tasks(VAL_SMALL_SIZES, VAL_SMALL_PER_SIZE, VAL_SMALL_SEED, "vals")


def build_val_small(data_dir: str | Path | None = None, workers: int | None = None) -> list[Instance]:
    """Generate ``val-small`` into `data_dir` and add its line to checksums.sha256 (other splits untouched)."""
    d = Path(data_dir or DATA_DIR)
    tasks = val_small_tasks()
    insts = [_tag(inst, agents=2, hole=task[2])
             for task, (_, inst, _) in zip(tasks, run_tasks(tasks, workers), strict=True) if inst is not None]
    atomic_write_lines(d / "val-small.jsonl", (i.to_json() for i in insts))
    sums = {**_read_checksums(d), "val-small.jsonl": sha256_file(d / "val-small.jsonl")} if (d / CHECKSUMS).exists() \
        else {"val-small.jsonl": sha256_file(d / "val-small.jsonl")}
    atomic_write_lines(d / CHECKSUMS, [f"{digest}  {name}" for name, digest in sums.items()])
    _load.cache_clear()
    return insts


def test_tasks(agents=TEST_AGENTS, waits=TEST_WAITS, sizes=SIZES, per_size=TEST_PER_SIZE, seed: int = TEST_SEED,
               prefix: str = "test") -> list[tuple]:
    """Every held-out task of `agents` x `waits` x `sizes` x `per_size`, indexed (and seeded) in that order;
    each carries the makespan search budget `BENCH_MAKESPAN_NODES`."""
    tasks = []
    for k in agents:
        for w in waits:
            for s in sizes:
                for j in range(per_size):
                    idx = len(tasks)
                    hole = min(HOLE_CYCLE[j % len(HOLE_CYCLE)], max_hole_ratio(s, k))
                    tasks.append((idx, s, hole, _spread(j, per_size, w), k, slot_seed(seed, idx),
                                  TEST_MAX_TRIES, f"{prefix}-a{k}-w{int(w * 100):02d}-s{s}-{j:02d}",
                                  BENCH_MAKESPAN_NODES))
    return tasks


def test_cpu_tasks() -> list[tuple]:
    return test_tasks(TEST_CPU_AGENTS, TEST_WAITS, TEST_CPU_SIZES, TEST_PER_SIZE, TEST_CPU_SEED, "tcpu")


def _held_out(tasks: list[tuple], results: list, waits=TEST_WAITS) -> tuple[list[Instance], dict]:
    """The instances of `tasks` tagged {agents, wait, hole}, and per (agents, wait) subset what was asked and made."""
    insts: list[Instance] = []
    subsets: dict[str, dict] = {}
    per_wait = len(tasks) // (len({t[4] for t in tasks}) * len(waits))  # tasks run agents, then wait, then size
    for task, (_, inst, info) in zip(tasks, results, strict=True):
        _, s, hole, wants, k = task[:5]
        w = waits[(task[0] // per_wait) % len(waits)]
        key = f"a{k}-w{int(w * 100):02d}"
        st = subsets.setdefault(key, {"asked": 0, "produced": 0, "asked_wait": 0, "needs_wait": 0,
                                      "wait_shortfall": 0, "nowait_shortfall": 0, "tries": 0})
        st["asked"] += 1
        st["asked_wait"] += int(wants)
        st["tries"] += info["tries"]
        if inst is None:
            continue
        st["produced"] += 1
        st["needs_wait"] += int(inst.needs_wait)
        if info["missed"]:
            st["wait_shortfall" if wants else "nowait_shortfall"] += 1
        insts.append(_tag(inst, agents=k, wait=w, hole=hole))
    return insts, subsets


def _tag(inst: Instance, **tags) -> Instance:
    return inst.model_copy(update={"tags": tags})


def build(data_dir: str | Path | None = None, workers: int | None = None, log=print) -> dict:
    """Generate all splits into `data_dir` (default env/data), write checksums.sha256 and build.json."""
    d = Path(data_dir or DATA_DIR)
    d.mkdir(parents=True, exist_ok=True)
    report: dict = {"splits": {}}
    t0 = time.perf_counter()
    vtasks = val_tasks()
    val = [_tag(inst, agents=2, hole=task[2])
           for task, (_, inst, _) in zip(vtasks, run_tasks(vtasks, workers), strict=True) if inst is not None]
    report["splits"]["val"] = {"seconds": round(time.perf_counter() - t0, 1), "count": len(val),
                               "needs_wait": sum(i.needs_wait for i in val)}
    log(f"val: {len(val)} instances in {time.perf_counter() - t0:.1f}s")
    mini = [i for i in val if i.size in VAL_MINI_SIZES and int(i.id.rsplit("-", 1)[1]) < VAL_MINI_PER_SIZE]

    t1 = time.perf_counter()
    tasks = test_tasks()
    held, subsets = _held_out(tasks, run_tasks(tasks, workers))
    test = [i for i in held if paper_cell(i.num_agents, i.size)]
    extra = [i for i in held if not paper_cell(i.num_agents, i.size)]
    report["splits"]["test"] = {"seconds": round(time.perf_counter() - t1, 1), "count": len(test),
                                "extra": len(extra), "subsets": subsets}
    log(f"test: {len(test)} instances (+{len(extra)} in test-extra) in {time.perf_counter() - t1:.1f}s")
    seen: set[tuple] = set()
    test_mini = []
    for i in test:
        key = (i.tags["agents"], i.tags["wait"], i.size)
        if key not in seen:
            seen.add(key)
            test_mini.append(i)
    t2 = time.perf_counter()
    cpu_tasks = test_cpu_tasks()
    test_cpu, cpu_subsets = _held_out(cpu_tasks, run_tasks(cpu_tasks, workers))
    report["splits"]["test-cpu"] = {"seconds": round(time.perf_counter() - t2, 1), "count": len(test_cpu),
                                    "subsets": cpu_subsets}
    log(f"test-cpu: {len(test_cpu)} instances in {time.perf_counter() - t2:.1f}s")
    vs_tasks = val_small_tasks()
    val_small = [_tag(inst, agents=2, hole=task[2]) for task, (_, inst, _)
                 in zip(vs_tasks, run_tasks(vs_tasks, workers), strict=True) if inst is not None]
    files = {"val": val, "val-mini": mini, "val-small": val_small, "test": test, "test-extra": extra,
             "test-mini": test_mini, "test-cpu": test_cpu}
    for name, insts in files.items():
        atomic_write_lines(d / f"{name}.jsonl", (i.to_json() for i in insts))
    sums = [f"{sha256_file(d / f'{name}.jsonl')}  {name}.jsonl" for name in files]
    atomic_write_lines(d / CHECKSUMS, sums)
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    report["counts"] = {name: len(v) for name, v in files.items()}
    atomic_write_lines(d / "build.json", [json.dumps(report, indent=1)])
    _load.cache_clear()
    return report
