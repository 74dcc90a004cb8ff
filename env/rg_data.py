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
import json
import os
import sys
import time
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
        from .rg_levels import one_line

        return f"its scorer fails on its own answer: {one_line(e)}"
    return None if score >= 1.0 else f"its scorer gives its own answer {score:g}, not 1"


def mix(seed: int, salt: Any) -> int:
    return int(hashlib.sha256(f"{seed}:{salt}".encode()).hexdigest()[:8], 16)


@dataclass
class Draw:
    """A level's draw: its items, how many were asked for, and the generator's errors met on the way."""

    items: list[RgItem]
    asked: int
    errors: list[str] = field(default_factory=list)

    @property
    def short(self) -> int:
        return max(0, self.asked - len(self.items))


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
            try:
                e = ds[i]
            except Exception as err:  # a generator that fails on some seeds: that item is skipped, and counted
                from .rg_levels import one_line

                out.errors.append(one_line(err))
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
