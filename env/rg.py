"""reasoning-gym datasets as a task family: `TASK=rg:<dataset>` trains and engineers any reasoning-gym dataset
that has a curriculum (102 of the 106 in reasoning-gym 0.1.25), through the same task seam as MAPF-FrozenLake.

Levels. A dataset's curriculum (`reasoning_gym.factory.create_curriculum`) names its difficulty attributes, each
with a list of levels (`basic_arithmetic`: `num_terms` 2-6, `num_digits` 1-4). The family's levels are the cells
of their grid, numbered 0, 1, ... with the first attribute varying slowest, each cell generated with every
attribute at exactly that level (reasoning-gym's `upper_bound` mode). A task name may narrow the grid to the
values it lists: `rg:basic_arithmetic:num_terms=2-4,num_digits=1-2` (values, not indices; `name=v` pins one).
A grid is at most `MAX_LEVELS` cells, so that an engineer can read and allocate it.

Config (the engineer's levers): `{"levels": {"<level>": <share>, ...}, "num_instances": n}`: the share of the
stage's questions drawn from each level (the shares sum to 1; a level left out gets none).

Answers are scored by the dataset's own `score_answer`: 1 is valid; a score strictly between 0 and 1 is
`partial` (the scorer's partial credit); 0 is `wrong`, or `no_answer` when the answer is empty. The policy is
asked for the final answer only; its answer is the completion's first non-empty line, stripped.

Splits. `val` and `test` are fixed: seeded per level from seeds of their own, so every level is in both, and a
stage's training questions never repeat one of theirs (the same question text is dropped and redrawn).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .task import TaskVerdict

MAX_LEVELS = 36  # the most cells a task's level grid may have
SPLIT_SIZES = {"val": 24, "test": 48}  # questions per level in each fixed split
SPLIT_SEEDS = {"val": 7_000_003, "test": 9_000_011}
ANSWER_HINT = "Give only the final answer."
FAILURES = ("no_answer", "wrong", "partial")
SHARE_SUM_TOL = 1e-6  # as MAPF's data ratios: a config off by more is projected (scaled to 1), not accepted


class RgTaskError(ValueError):
    """A task name, attribute or level that the dataset does not have (one line naming what is allowed)."""


def _value(v: Any) -> str:
    if isinstance(v, tuple):
        return "-".join(_value(x) for x in v)
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Level:
    """One cell of the level grid: each attribute's level index, and its values."""

    index: int
    attr_levels: tuple[tuple[str, int], ...]
    attr_values: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return " ".join(f"{a}={_value(v)}" for a, v in self.attr_values)


@dataclass(frozen=True)
class RgItem:
    """One question: its id, level, text, gold answer and reasoning-gym's metadata (its scorer reads it)."""

    id: str
    level: int
    question: str
    answer: str
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    def entry(self) -> dict:
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


class RgConfig(BaseModel):
    """A stage's config: the share of questions from each level, and how many questions."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    levels: dict[int, float] = Field(description="level -> share of the stage's questions (shares sum to 1)")
    num_instances: int = Field(64, ge=1, description="questions generated for the stage")

    @field_validator("levels")
    @classmethod
    def _shares(cls, v: dict[int, float]) -> dict[int, float]:
        if not v:
            raise ValueError("no level given: give at least one level a share above 0")
        for k, s in v.items():
            if not (isinstance(s, int | float) and math.isfinite(s) and 0 <= s <= 1):
                raise ValueError(f"level {k} has share {s!r}: allowed: a share in [0, 1]")
        total = sum(v.values())
        if total <= 0:
            raise ValueError("every share is 0; give at least one level a share above 0")
        if abs(total - 1.0) > SHARE_SUM_TOL:
            raise ValueError(f"the shares sum to {total:.10g}; allowed: shares that sum to 1 (within {SHARE_SUM_TOL:g})")
        return {int(k): float(s) for k, s in sorted(v.items())}


def parse_name(name: str) -> tuple[str, dict[str, list[str]]]:
    """`rg:<dataset>[:attr=lo-hi,attr=v]` -> (dataset, {attr: [lo, hi] or [v]})."""
    if not name.startswith("rg:"):
        raise RgTaskError(f"task {name!r}: a reasoning-gym task is named rg:<dataset>[:attr=lo-hi,...]")
    rest = name[3:]
    dataset, _, spec = rest.partition(":")
    narrow: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        attr, eq, values = part.partition("=")
        if not eq or not attr or not values:
            raise RgTaskError(f"task {name!r}: {part!r} is not attr=value or attr=lo-hi")
        m = re.fullmatch(r"(-?[^-]+)-(-?[^-]+)", values.strip())
        narrow[attr.strip()] = [m.group(1), m.group(2)] if m else [values.strip()]
    return dataset, narrow


def datasets_with_curriculum() -> list[str]:
    from reasoning_gym.factory import CURRICULA

    return sorted(CURRICULA)


class RgTask:
    """A reasoning-gym dataset as a task family (see the module docstring)."""

    failure_labels = FAILURES
    level_word = "level"
    split_names = tuple(SPLIT_SIZES)

    def __init__(self, name: str):
        import reasoning_gym  # noqa: F401  (registers the datasets)
        from reasoning_gym.factory import CURRICULA, DATASETS

        dataset, narrow = parse_name(name)
        if dataset not in CURRICULA:
            known = ", ".join(sorted(CURRICULA))
            extra = " (it has no curriculum)" if dataset in DATASETS else ""
            raise RgTaskError(f"task {name!r}: unknown reasoning-gym dataset {dataset!r}{extra}; allowed: {known}")
        self.name = name
        self.dataset = dataset
        curriculum = CURRICULA[dataset]()
        attrs = curriculum.attributes
        for attr in narrow:
            if attr not in attrs:
                raise RgTaskError(f"task {name!r}: {dataset} has no attribute {attr!r}; allowed: "
                                  f"{', '.join(attrs)}")
        axes: list[tuple[str, list[tuple[int, Any]]]] = []
        for attr, d in attrs.items():
            pairs = list(enumerate(d.levels))
            if attr in narrow:
                pairs = self._narrow(name, attr, pairs, narrow[attr])
            axes.append((attr, pairs))
        self.attributes = {a: (list(d.levels), d.description or "") for a, d in attrs.items()}
        self.levels: list[Level] = []
        seen: set[tuple] = set()
        for cell in itertools.product(*(pairs for _, pairs in axes)):
            attr_levels = tuple((a, lv) for (a, _), (lv, _) in zip(axes, cell, strict=True))
            values = self._resolved(attr_levels)
            if values in seen:  # an interval attribute's top level repeats the one below it: one cell
                continue
            seen.add(values)
            self.levels.append(Level(len(self.levels), attr_levels, values))
        if len(self.levels) > MAX_LEVELS:
            sizes = ", ".join(f"{a} ({len(p)}: {'/'.join(_value(v) for _, v in p)})" for a, p in axes)
            raise RgTaskError(f"task {name!r}: its level grid has {len(self.levels)} cells, more than {MAX_LEVELS}: "
                              f"{sizes}; narrow it, e.g. rg:{dataset}:{axes[0][0]}="
                              f"{_value(axes[0][1][0][1])}-{_value(axes[0][1][min(2, len(axes[0][1]) - 1)][1])}")
        self._datasets: dict[tuple[int, int, int], Any] = {}

    def _resolved(self, attr_levels: tuple[tuple[str, int], ...]) -> tuple[tuple[str, Any], ...]:
        """What a cell generates: each attribute's value, or its (low, high) range, as reasoning-gym resolves it."""
        from reasoning_gym.coaching.attributes import RangeAttributeDefinition
        from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
        from reasoning_gym.factory import CURRICULA

        cur = CURRICULA[self.dataset]()
        for attr, lv in attr_levels:
            cur.set_attr_level(attr, lv)
        ctx = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
        out = []
        for attr, _ in attr_levels:
            d = cur.attributes[attr]
            v = ctx.get_attr_value(cur, d)
            if isinstance(d, RangeAttributeDefinition):
                lo, hi = (min(v), max(v)) if isinstance(v, list | tuple) else (v, v)
                out.append((attr, lo if lo == hi else (lo, hi)))
            else:
                out.append((attr, v))
        return tuple(out)

    @staticmethod
    def _narrow(name: str, attr: str, pairs: list[tuple[int, Any]], values: list[str]) -> list[tuple[int, Any]]:
        shown = [_value(v) for _, v in pairs]
        idx = []
        for v in values:
            if v not in shown:
                raise RgTaskError(f"task {name!r}: {attr}={v} is not one of its levels; allowed: {', '.join(shown)}")
            idx.append(shown.index(v))
        lo, hi = min(idx), max(idx)
        return pairs[lo:hi + 1]

    # ------------------------------------------------------------------ generation

    def _rg_dataset(self, level: int, n: int, seed: int):
        key = (level, n, seed)
        ds = self._datasets.get(key)
        if ds is None:
            from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
            from reasoning_gym.factory import CURRICULA, DATASETS

            cur = CURRICULA[self.dataset]()
            for attr, lv in self.levels[level].attr_levels:
                cur.set_attr_level(attr, lv)
            cfg = cur.generate_configuration({"size": max(1, n), "seed": seed},
                                             DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND))
            if hasattr(cfg, "validate"):
                cfg.validate()
            ds = DATASETS[self.dataset][0](config=cfg)
            if len(self._datasets) > 256:
                self._datasets.clear()
            self._datasets[key] = ds
        return ds

    def level_items(self, level: int, n: int, seed: int, avoid: set[str] | None = None) -> list[RgItem]:
        """`n` questions of `level` from `seed`, none of whose text is in `avoid`."""
        if not 0 <= level < len(self.levels):
            raise RgTaskError(f"task {self.name!r}: level {level}: allowed: 0-{len(self.levels) - 1}")
        out: list[RgItem] = []
        seen = set(avoid or ())
        for attempt in range(6):
            want = n - len(out)
            if want <= 0:
                break
            s = seed if attempt == 0 else seed * 31 + attempt
            ds = self._rg_dataset(level, want + (want // 4 if attempt else 0) + 1, s)
            for i in range(len(ds)):
                e = ds[i]
                q = str(e["question"])
                if q in seen:
                    continue
                seen.add(q)
                digest = hashlib.sha256(f"{self.dataset}|{level}|{q}".encode()).hexdigest()[:12]
                out.append(RgItem(f"{self.dataset}-L{level}-{digest}", level, q, str(e["answer"]),
                                  json.loads(json.dumps(e.get("metadata") or {}, default=str))))
                if len(out) >= n:
                    break
        return out

    def generate(self, config: RgConfig, n: int, seed: int) -> tuple[list[RgItem], dict[str, Any]]:
        """A stage's `n` questions, spread over the config's levels by their shares (largest remainders), in a
        shuffled order; none repeats a question of the fixed splits."""
        counts = allocate(config.levels, n)
        avoid = self.split_questions()
        items: list[RgItem] = []
        for level, k in counts.items():
            if k:
                items.extend(self.level_items(level, k, seed=_mix(seed, level), avoid=avoid))
        random.Random(seed).shuffle(items)
        return items, {"requested": {str(k): v for k, v in counts.items()},
                       "generated": {str(lv): sum(1 for i in items if i.level == lv) for lv in counts}}

    def split(self, name: str) -> list[RgItem]:
        """The fixed split `name` (val or test): `SPLIT_SIZES[name]` questions per level."""
        if name not in SPLIT_SIZES:
            raise RgTaskError(f"split {name!r}: allowed for rg tasks: {', '.join(SPLIT_SIZES)}")
        return list(self._splits[name])

    @cached_property
    def _splits(self) -> dict[str, list[RgItem]]:
        out: dict[str, list[RgItem]] = {}
        taken: set[str] = set()
        for name, per in SPLIT_SIZES.items():
            items: list[RgItem] = []
            for lv in range(len(self.levels)):
                got = self.level_items(lv, per, seed=_mix(SPLIT_SEEDS[name], lv), avoid=taken)
                taken.update(i.question for i in got)
                items.extend(got)
            out[name] = items
        return out

    def split_questions(self) -> set[str]:
        return {i.question for items in self._splits.values() for i in items}

    # ------------------------------------------------------------------ the trainer's seam (trainer.task.Task)

    def item_to_json(self, item: RgItem) -> str:
        return json.dumps({"id": item.id, "level": item.level, "question": item.question, "answer": item.answer,
                           "metadata": item.metadata}, sort_keys=True)

    def item_from_json(self, text: str) -> RgItem:
        d = json.loads(text)
        return RgItem(d["id"], int(d["level"]), d["question"], d["answer"], d.get("metadata") or {})

    def item_id(self, item: RgItem) -> str:
        return item.id

    def level(self, item: RgItem) -> int:
        return item.level

    def prompt(self, item: RgItem, style: str = "compact") -> list[dict]:
        return [{"role": "user", "content": f"{item.question}\n{ANSWER_HINT}"}]

    def gold(self, item: RgItem) -> str:
        return item.answer

    def warm_start_items(self, levels: list[int] | None, n: int, seed: int) -> list[RgItem]:
        """`n` fresh questions spread evenly over every level of the grid, none in a fixed split. (`levels` is
        the trainer's `sft_sizes`, MAPF's grid sizes: an rg warm start always covers the whole grid.)"""
        levels = list(range(len(self.levels)))
        share = {lv: 1 / len(levels) for lv in levels}
        items, _ = self.generate(RgConfig(levels=share, num_instances=n), n, seed=_mix(seed, 104_729))
        return items

    def answer_of(self, text: str) -> str:
        lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
        return lines[0] if lines else ""

    def verify(self, item: RgItem, text: str) -> TaskVerdict:
        answer = self.answer_of(text)
        if not answer:
            return TaskVerdict(False, "no_answer", 0.0, False)
        ds = self._rg_dataset(item.level, 1, 0)
        try:
            score = float(ds.score_answer(answer, item.entry()))
        except Exception:  # a scorer that cannot read the answer (e.g. unparsable) gives it no credit
            score = 0.0
        score = min(1.0, max(0.0, score))
        if score >= 1.0:
            return TaskVerdict(True, None, 1.0, True)
        return TaskVerdict(False, "partial" if score > 0 else "wrong", score, False)

    # ------------------------------------------------------------------ what the loop shows the engineer

    def describe_levels(self) -> str:
        """A markdown table of the level grid, from the dataset's curriculum (for the engineer's prompt)."""
        lines = ["| level | " + " | ".join(self.attributes_in_grid()) + " |",
                 "|---|" + "---|" * len(self.attributes_in_grid())]
        for lv in self.levels:
            lines.append(f"| {lv.index} | " + " | ".join(_value(v) for _, v in lv.attr_values) + " |")
        return "\n".join(lines)

    def attributes_in_grid(self) -> list[str]:
        return [a for a, _ in self.levels[0].attr_values]

    def describe_attributes(self) -> str:
        return "\n".join(f"- `{a}`: {desc or 'a difficulty attribute'} (levels "
                         f"{', '.join(_value(v) for v in levels)})" for a, (levels, desc) in self.attributes.items()
                         if a in self.attributes_in_grid())

    def parse_config(self, raw: Any, num_instances: int | None = None) -> RgConfig:
        """A config from the engineer's JSON (`{"levels": {...}}`), strictly: an unknown level, a share outside
        [0, 1] or shares not summing to 1 raise `ValueError` naming the value and what is allowed."""
        if isinstance(raw, RgConfig):
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"config {raw!r}: allowed: an object {{\"levels\": {{\"<level>\": share, ...}}}}")
        extra = set(raw) - {"levels", "num_instances"}
        if extra:
            raise ValueError(f"config: unknown key(s) {', '.join(sorted(map(str, extra)))}; allowed: levels")
        levels = raw.get("levels")
        if not isinstance(levels, dict):
            raise ValueError(f"levels {levels!r}: allowed: an object mapping a level (0-{len(self.levels) - 1}) "
                             "to its share")
        shares: dict[int, Any] = {}
        for k, v in levels.items():
            try:
                lv = int(str(k))
            except ValueError:
                lv = -1
            if not 0 <= lv < len(self.levels) or str(lv) != str(k).strip():
                raise ValueError(f"levels: {k!r} is not a level; allowed: 0-{len(self.levels) - 1}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"levels[{k}] = {v!r}: allowed: a number in [0, 1]")
            shares[lv] = v
        n = num_instances if num_instances is not None else raw.get("num_instances", 64)
        return RgConfig(levels=shares, num_instances=n)

    def project(self, raw: Any) -> RgConfig:
        """The nearest valid config: known levels only, negative shares dropped, the rest scaled to sum to 1."""
        levels = raw.get("levels") if isinstance(raw, dict) else None
        if not isinstance(levels, dict):
            raise ValueError("no levels to project")
        kept: dict[int, float] = {}
        for k, v in levels.items():
            try:
                lv = int(str(k))
            except ValueError:
                continue
            if 0 <= lv < len(self.levels) and isinstance(v, int | float) and not isinstance(v, bool) \
                    and math.isfinite(v) and v > 0:
                kept[lv] = float(v)
        total = sum(kept.values())
        if not kept or total <= 0:
            raise ValueError("no level with a positive share")
        return RgConfig(levels={k: v / total for k, v in kept.items()})  # the caller sets num_instances

    def random_config(self, seed: int, num_instances: int = 64) -> RgConfig:
        """A random stage-0 config: 1-3 levels from the easier half of the grid, random shares."""
        rng = random.Random(seed)
        half = max(1, (len(self.levels) + 1) // 2)
        picked = rng.sample(range(half), k=min(half, rng.randint(1, 3)))
        w = [rng.random() + 0.1 for _ in picked]
        return RgConfig(levels={lv: x / sum(w) for lv, x in zip(picked, w, strict=True)},
                        num_instances=num_instances)


def allocate(shares: dict[int, float], n: int) -> dict[int, int]:
    """`n` split over levels by their shares, by largest remainders (ties: the lower level)."""
    raw = {k: shares[k] * n for k in sorted(shares)}
    counts = {k: int(math.floor(v)) for k, v in raw.items()}
    left = n - sum(counts.values())
    for k in sorted(raw, key=lambda k: (-(raw[k] - counts[k]), k))[:left]:
        counts[k] += 1
    return counts


def _mix(seed: int, level: int) -> int:
    return int(hashlib.sha256(f"{seed}:{level}".encode()).hexdigest()[:8], 16)
