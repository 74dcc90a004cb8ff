"""Questions of a reasoning-gym task (`env.rg`): drawing distinct questions of a level, the on-disk cache of the
fixed splits, and progress lines for slow generators.

Drawing. reasoning-gym draws item `idx` of a dataset seeded `s` from `Random(s + idx)`, so two datasets whose seeds
differ by less than their size share items. A level's questions come from one dataset seeded `seed`; where some
repeat (or are avoided: the fixed splits, or a lower level's questions), the draw goes on with datasets from
seeds hashed apart, until it has `n` distinct questions or has drawn `DRAW_FACTOR` times `n` items; what it could
not supply is reported (`Draw.short`), never hidden.

Gold answers. An entry's `answer`; where reasoning-gym leaves it None and keeps one answer that its scorer
accepts in the metadata (`GOLD_KEYS`), that one. A question whose gold answer the dataset's own scorer does not
score 1 is skipped (and counted in `Draw.errors`): the task never trains or evaluates on it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import time
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GOLD_KEYS = ("possible_answer", "example_answer", "example_correct_answer")
DRAW_FACTOR = 8  # a level's draw gives up after this many items per question asked for
CACHE_FORMAT = 1  # bump when a cached split would no longer be what the code draws
PROGRESS_AFTER_S = 3.0  # work longer than this shows progress lines on stderr
PROGRESS_EVERY_S = 10.0
SCALARS = {int, float, str, bool, type(None)}


@dataclass(frozen=True)
class RgItem:
    """One question: its id, level, text, gold answer and reasoning-gym's metadata (its scorer reads it).
    `example_gold`: the gold is the metadata's example answer (reasoning-gym's entry has no answer)."""

    id: str
    level: int
    question: str
    answer: str
    metadata: dict = field(default_factory=dict, compare=False, hash=False)
    example_gold: bool = field(default=False, compare=False)

    def entry(self) -> dict:
        """The entry reasoning-gym's scorer reads, as reasoning-gym made it."""
        return {"question": self.question, "answer": None if self.example_gold else self.answer,
                "metadata": self.metadata}


def gold_of(entry: dict) -> str | None:
    """The entry's answer, else the metadata's example answer (`GOLD_KEYS`), as text; None when it has neither."""
    if entry.get("answer") is not None:
        return str(entry["answer"])
    meta = entry.get("metadata") or {}
    for k in GOLD_KEYS:
        v = meta.get(k)
        if v not in (None, ""):
            return v if isinstance(v, str) else json.dumps(v)
    return None


def encode(v: Any) -> Any:
    """Metadata as JSON, its Python types kept: a tuple, a set or a dict with keys other than text is tagged, so
    that `decode` gives back what reasoning-gym's scorer compares against (arc_agi compares tuples of tuples).
    An object JSON has no form for becomes its text."""
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v) and not any(k.startswith("__") and k.endswith("__") for k in v):
            return {k: encode(x) for k, x in v.items()}
        return {"__dict__": [[encode(k), encode(x)] for k, x in v.items()]}
    if isinstance(v, list | tuple) and set(map(type, v)) <= SCALARS:  # a row of numbers: no walk (it is fast)
        return {"__tuple__": list(v)} if isinstance(v, tuple) else v
    if isinstance(v, tuple):
        return {"__tuple__": [encode(x) for x in v]}
    if isinstance(v, set | frozenset):
        return {"__set__": sorted((encode(x) for x in v), key=repr)}
    if isinstance(v, list):
        return [encode(x) for x in v]
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if hasattr(v, "tolist"):  # numpy
        return encode(v.tolist())
    return str(v)


def decode(v: Any) -> Any:
    if isinstance(v, list):
        return v if set(map(type, v)) <= SCALARS else [decode(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1:
            (k, x), = v.items()
            if k == "__tuple__":
                return tuple(x) if set(map(type, x)) <= SCALARS else tuple(decode(y) for y in x)
            if k == "__set__":
                return {decode(y) for y in x}
            if k == "__dict__":
                return {decode(a): decode(b) for a, b in x}
        return {k: decode(x) for k, x in v.items()}
    return v


def make_item(dataset: str, level: int, entry: dict) -> RgItem | None:
    """The item of a reasoning-gym entry (None when it has no gold answer). Its metadata is what a stored item
    gives back (`decode(encode(...))`), so a fresh item and a stored one score alike."""
    gold = gold_of(entry)
    if gold is None:
        return None
    q = str(entry["question"])
    digest = hashlib.sha256(f"{dataset}|{level}|{q}".encode()).hexdigest()[:12]
    return RgItem(f"{dataset}-L{level}-{digest}", level, q, gold, decode(encode(entry.get("metadata") or {})),
                  entry.get("answer") is None)


def gold_rejected(ds, item: RgItem) -> str | None:
    """Why the dataset's own scorer rejects an item's gold answer (None: it scores 1)."""
    try:
        score = float(ds.score_answer(item.answer, item.entry()))
    except Exception as e:
        return f"its scorer fails on its own answer: {error_line(e)}"
    return None if score >= 1.0 else f"its scorer gives its own answer {score:g}, not 1"


def error_line(e: BaseException) -> str:
    """An error as one line (`Recorded`: the line of the error met where the item was drawn ahead)."""
    if isinstance(e, Recorded):
        return e.line
    from .rg_levels import one_line

    return one_line(e)


def mix(seed: int, salt: Any) -> int:
    return int(hashlib.sha256(f"{seed}:{salt}".encode()).hexdigest()[:8], 16)


@dataclass
class Draw:
    """A level's draw: its items, how many were asked for, and the generator's errors met on the way."""

    items: list[RgItem]
    asked: int
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # the CPU seconds its questions took to generate and check (`Ahead.draw`: the worker's too)

    @property
    def short(self) -> int:
        return max(0, self.asked - len(self.items))


ITEM_CPU_S = 2.0  # the most CPU seconds one question may take to generate: over it, the question is skipped and
# counted as an error (number_sequence squares its terms again and again on a few seeds: minutes, then hours, for one)


OVER_ITEM = f"its generator took over {ITEM_CPU_S:g} s of CPU for one question"


class OverBudget(BaseException):
    """A generator used up its CPU budget (a BaseException: a generator's `except Exception` lets it by). Its
    argument is the budget's token (`cpu_budget`)."""


@contextmanager
def cpu_budget(seconds: float):
    """Raise `OverBudget(token)` in this thread once the process has used `seconds` more CPU; yields the token.
    Where signals cannot do it (not the main thread, no `setitimer`), or inside another budget (which stays in force,
    its `OverBudget` passing through), no limit of its own: yields None."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer") \
            or signal.getitimer(signal.ITIMER_PROF)[0] > 0:
        yield None
        return
    token = object()

    def over(*_):
        raise OverBudget(token)

    old = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield token
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def draw(dataset_of, dataset: str, level: int, n: int, seed: int, seen: set[str]) -> Draw:
    """`n` questions of `level`, none of whose text is in `seen` (which grows by those drawn). `dataset_of(size,
    seed)` is reasoning-gym's dataset of the level. The first dataset is seeded `seed`, the second `seed * 31 + 1`
    (as the fixed splits were first drawn, so that they stay the same), the later ones hashed apart."""
    out = Draw([], n)
    budget, attempt = DRAW_FACTOR * n + 8, 0
    while len(out.items) < n and budget > 0:
        want = n - len(out.items)
        size = want + 1 if attempt == 0 else min(budget, want + want // 4 + 1 if attempt == 1 else 2 * want + 8)
        s = seed if attempt == 0 else seed * 31 + 1 if attempt == 1 else mix(seed, f"retry{attempt}")
        attempt += 1
        budget -= size
        ds = dataset_of(size, s)
        for i in range(len(ds)):
            token = None
            try:
                with redirect_stdout(io.StringIO()), cpu_budget(ITEM_CPU_S) as token:  # bf prints as it runs
                    e = ds[i]
            except OverBudget as over:
                if token is None or over.args[0] is not token:  # an outer budget's (a level's check): it ends there
                    raise
                out.errors.append(OVER_ITEM)
                continue
            except Exception as err:  # a generator that fails on some seeds: that item is skipped, and counted
                out.errors.append(error_line(err))
                continue
            q = str(e["question"])
            if q in seen:
                continue
            item = make_item(dataset, level, e)
            if item is None:
                continue
            why = gold_rejected(ds, item)
            if why:  # reasoning-gym's own answer to this question fails its own scorer (jugs' "No solution")
                out.errors.append(why)
                continue
            seen.add(q)
            out.items.append(item)
            if len(out.items) >= n:
                break
        if len(out.errors) > n + 8:  # the generator fails on most seeds: no use going on
            break
    return out


# ---------------------------------------------------------------------------------------------- drawing ahead


class Recorded(Exception):
    """An error that a generator or a scorer met in the worker that drew ahead, given back as its line."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


class _Recorder:
    """A reasoning-gym dataset that keeps what `draw` reads of it: each item (or its error), and its scorer's
    verdict (or error) on an answer to the item read last."""

    def __init__(self, ds):
        self.ds, self.items, self.scores, self.last = ds, {}, {}, -1

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        self.last = i
        try:
            self.items[i] = (True, self.ds[i])
        except OverBudget:  # the parent skips it as the worker did, without generating it again
            self.items[i] = (False, OVER_ITEM)
            raise
        except Exception as err:
            self.items[i] = (False, error_line(err))
            raise
        return self.items[i][1]

    def score_answer(self, answer, entry):
        key = (self.last, answer)
        try:
            self.scores[key] = (True, self.ds.score_answer(answer, entry))
        except Exception as err:
            self.scores[key] = (False, error_line(err))
            raise
        return self.scores[key][1]


class _Replay:
    """A dataset drawn ahead: what its recording holds, given back as recorded (errors as `Recorded`); the rest
    from the dataset itself, made where first needed."""

    def __init__(self, recorded: tuple | None, make):
        self.length, self.items, self.scores = recorded or (None, {}, {})
        self.make, self.ds, self.last = make, None, -1

    def _real(self):
        if self.ds is None:
            self.ds = self.make()
        return self.ds

    def __len__(self) -> int:
        return self.length if self.length is not None else len(self._real())

    def __getitem__(self, i: int):
        self.last = i
        return _given(self.items[i]) if i in self.items else self._real()[i]

    def score_answer(self, answer, entry):
        got = self.scores.get((self.last, answer))
        return _given(got) if got is not None else self._real().score_answer(answer, entry)


def _given(recorded: tuple):
    ok, value = recorded
    if not ok:
        raise Recorded(value)
    return value


_AHEAD: tuple | None = None  # (make, dataset) of the draws being recorded: the forked workers find them here


def _record(job: tuple[int, int, int]) -> dict:
    """In a worker: `draw` of one job as if nothing were avoided, every dataset it reads recorded."""
    level, n, seed = job
    make, dataset = _AHEAD
    t0 = time.process_time()
    recorders: dict[tuple[int, int], _Recorder] = {}

    def dataset_of(size: int, s: int):
        recorders[size, s] = _Recorder(make(level, size, s))
        return recorders[size, s]

    try:
        draw(dataset_of, dataset, level, n, seed, set())
    except Exception:  # the parent's draw meets it again, where it would have without drawing ahead
        pass
    return {"cpu": time.process_time() - t0, **{key: (len(r.ds), r.items, r.scores) for key, r in recorders.items()}}


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_signals() -> None:
    """In a forked worker: SIGTERM ends it, whatever handler the parent had (a stage's child process turns SIGTERM
    into a stop request, which would leave the pool waiting for a worker that never ends); Ctrl-C is the parent's."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Ahead:
    """The draws `jobs` (`draw`'s level, n and seed), to be asked for in that order, each avoiding the questions of
    those before it: `Ahead.draw` gives exactly what `draw` gives, the questions generated ahead on every core.

    A forked worker draws each job as if nothing were avoided, recording every item and scorer verdict it reads;
    the parent then runs `draw` itself over the recording, taking an item from it where it holds one and asking
    reasoning-gym for the rest (the retries of a level whose questions the levels before it took). So the result
    does not depend on the workers: reasoning-gym's item `i` of a dataset depends only on its config, its seed
    and `i`. With one core, without fork or in a daemon process, nothing is drawn ahead."""

    def __init__(self, make, dataset: str, jobs: list[tuple[int, int, int]], workers: int | None = None):
        self.make, self.dataset, self.jobs = make, dataset, list(jobs)
        self.workers = min(cores() if workers is None else workers, len(self.jobs))
        self._pool = self._results = None
        self._next = 0

    def __enter__(self) -> Ahead:
        import multiprocessing as mp

        global _AHEAD
        if self.workers > 1 and "fork" in mp.get_all_start_methods() and not mp.current_process().daemon:
            _AHEAD = (self.make, self.dataset)
            self._pool = mp.get_context("fork").Pool(self.workers, initializer=default_signals)
            self._results = self._pool.imap(_record, self.jobs)
        return self

    def __exit__(self, *exc) -> None:
        global _AHEAD
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
        _AHEAD = None

    def draw(self, level: int, n: int, seed: int, seen: set[str]) -> Draw:
        recorded: dict = {}
        if self._results is not None:
            if self.jobs[self._next] != (level, n, seed):
                raise RuntimeError(f"draw {(level, n, seed)} asked for out of order: the next is {self.jobs[self._next]}")
            self._next += 1
            try:
                recorded = next(self._results)
            except Exception:  # a recording that could not come back (an item pickle cannot carry): drawn here
                recorded = {}
        t0 = time.process_time()
        got = draw(lambda size, s: _Replay(recorded.get((size, s)), lambda: self.make(level, size, s)), self.dataset,
                   level, n, seed, seen)
        got.cpu_s = recorded.get("cpu", 0.0) + time.process_time() - t0
        return got


# ---------------------------------------------------------------------------------------------- the split cache


def cache_dir() -> Path:
    """`$ENV_ENGINEER_CACHE/rg` (default ~/.cache/env-engineer/rg): the fixed splits, drawn once per task."""
    root = os.environ.get("ENV_ENGINEER_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "env-engineer") / "rg"


def cache_path(spec: dict) -> Path:
    key = hashlib.sha256(json.dumps({**spec, "format": CACHE_FORMAT}, sort_keys=True, default=str).encode())
    return cache_dir() / f"{spec['dataset']}-{key.hexdigest()[:16]}.json"


def read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_cache(path: Path, data: dict) -> None:
    """Written whole then renamed, so that a reader never sees half a file; a cache that cannot be written is
    skipped (the splits are drawn again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass


def item_dict(item: RgItem) -> dict:
    d = {"id": item.id, "level": item.level, "question": item.question, "answer": item.answer,
         "metadata": encode(item.metadata)}
    return {**d, "example_gold": True} if item.example_gold else d


def item_of(d: dict) -> RgItem:
    return RgItem(d["id"], int(d["level"]), d["question"], d["answer"], decode(d.get("metadata") or {}),
                  bool(d.get("example_gold", False)))


class Progress:
    """Progress lines on stderr for work that takes longer than `PROGRESS_AFTER_S`, one every `PROGRESS_EVERY_S`."""

    def __init__(self, what: str):
        self.what, self.t0, self.last = what, time.monotonic(), 0.0

    def step(self, done: int, total: int, note: str = "") -> None:
        now = time.monotonic() - self.t0
        if now >= PROGRESS_AFTER_S and (now - self.last >= PROGRESS_EVERY_S or done == total):
            self.last = now
            print(f"{self.what}: {done}/{total}{' ' + note if note else ''} ({now:.0f} s)", file=sys.stderr,
                  flush=True)
