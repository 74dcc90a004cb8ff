"""reasoning-gym datasets as a task family: `TASK=rg:<dataset>` trains and engineers any reasoning-gym dataset
that has a curriculum, through the same task seam as MAPF-FrozenLake. `python -m env.rg --list` lists them.

Levels (`env.rg_levels`). The cells of a dataset's curriculum: its full grid where that has at most 25 cells, else
a ladder of at most 8 cells from easiest to hardest. A name narrows attributes or picks the kind:
`rg:basic_arithmetic:num_terms=2-4,num_digits=1-2`, `rg:leg_counting:levels=grid`. A cell is dropped, with a note
(`RgTask.dropped`), where reasoning-gym's config check refuses it, its generator raises or takes over half a
second of CPU a question (`env.rg_probe.QUESTION_CPU_S`: a level's questions must be quick to draw), its questions
carry no answer that reasoning-gym's own scorer accepts, or that scorer accepts junk. A task must load in about
half a minute on 2 cores: where its fixed splits would take over `LOAD_CPU_S` of CPU to draw (timed level after
level on their `val` questions), the first level over it and those after it are dropped (sokoban's larger boards).

Config (the engineer's levers): `{"levels": {"<level>": <share>, ...}, "num_instances": n}`: the share of the
stage's questions drawn from each level (the shares sum to 1; a level left out gets none).

Answer format. The prompt is the question, then `ANSWER_HINT`. The answer is the last `<answer>...</answer>`
block of the completion where it has one (reasoning-gym's `extract_answer`); else the bare completion, cut to as
many lines as the gold answer has (one-line answers: the first non-empty line; a matrix or a move list: its
rows), stripped. The dataset's own `score_answer` judges it: 1 is valid; a score strictly between 0 and 1 is
`partial`; 0 is `wrong`, or `no_answer` when the answer is empty.

Reward. Validity, 1 or 0: the scorer's partial credit rewards answers that are never right (reasoning-gym's
default scorer gives credit for the gold inside the answer: `-10` earns some for golds 0, 1, -1 and 10). The
setting `partial_credit` > 0 adds that much times the scorer's score to an invalid answer (`TaskReward`).

Splits. `val` and `test` are fixed: seeded per level from seeds of their own, drawn once and cached on disk
(`env.rg_data.cache_dir`), so every level is in both; their questions are generated on every core, the same
questions as a draw level after level gives (`env.rg_data.Ahead`). A stage's and a warm start's questions never repeat one of
theirs, and within one draw a question two levels share counts once, at the lower level. A level that cannot
supply the questions asked of it says so (`short` in the stage's figures, and a line on stderr).
"""

from __future__ import annotations

import math
import random
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .rg_data import (
    Ahead,
    Draw,
    Progress,
    RgItem,
    cache_path,
    draw,
    item_dict,
    item_of,
    mix,
    read_cache,
    write_cache,
)
from .rg_levels import (
    MAX_LEVELS,
    Level,
    RgLevels,
    RgTaskError,
    datasets_with_curriculum,
    make_dataset,
    parse_name,
    value_text,
)
from .rg_probe import PROBE_RULE, probe_cells
from .task import TaskVerdict

__all__ = ["MAX_LEVELS", "SPLIT_SIZES", "RgConfig", "RgItem", "RgTask", "RgTaskError", "datasets_with_curriculum",
           "parse_name"]

SPLIT_SIZES = {"val": 24, "test": 48}  # questions per level in each fixed split
SPLIT_SEEDS = {"val": 7_000_003, "test": 9_000_011}
LOAD_CPU_S = 60.0  # the most CPU seconds a task's fixed splits may take to draw (about 30 s on 2 cores): sokoban's
# boards take 0.1-0.6 s a question on average, with a long tail, so its 6 levels' 72 split questions each would take
# over a minute; its levels from the first one over it are dropped
ANSWER_HINT = "Give only the final answer, bare or as <answer>...</answer>."
FAILURES = ("no_answer", "wrong", "partial")
SHARE_SUM_TOL = 1e-6  # as MAPF's data ratios: a config off by more is projected (scaled to 1), not accepted


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


def extract(text: str, gold: str) -> str:
    """The answer of a completion (the module docstring's rule).

    >>> extract("12\\nbecause 5 + 7 = 12", "12"), extract("so <answer>12</answer>", "12")
    ('12', '12')
    >>> extract("1 2\\n3 4\\nThat is the matrix.", "5 6\\n7 8")
    '1 2\\n3 4'
    """
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(str(text))
    if tagged is not None:
        return tagged
    rows = max(1, len(str(gold).strip().splitlines()))
    return "\n".join(str(text).strip().splitlines()[:rows]).strip()


class RgTask:
    """A reasoning-gym dataset as a task family (see the module docstring)."""

    failure_labels = FAILURES
    level_word = "level"
    split_names = tuple(SPLIT_SIZES)

    def __init__(self, name: str):
        self._lv = RgLevels(name)
        self.name, self.dataset, self.kind = name, self._lv.dataset, self._lv.kind
        self.attributes = self._lv.attributes
        self._datasets: dict[tuple[int, int, int], Any] = {}
        self._scorers: dict[int, Any] = {}
        self._probe()
        if self._lv.levels:
            self._fit_load_budget()
        if not self._lv.levels:
            # the last note: the level check's, where it dropped any (reasoning-gym's config refusals come first)
            raise RgTaskError(f"task {name!r}: every level of {self.dataset} is dropped ({self._lv.dropped[-1]}); "
                              "allowed: a dataset with a usable level (python -m env.rg --list)")

    @property
    def levels(self) -> list[Level]:
        return self._lv.levels

    @property
    def dropped(self) -> list[str]:
        """One note per cell left out of the levels: its attributes and why."""
        return list(self._lv.dropped)

    def _probe(self) -> None:
        """Drop the cells whose generator raises, takes over `QUESTION_CPU_S` of CPU a question, or gives
        questions with no answer that the dataset's own scorer accepts (`env.rg_probe`: a few questions of a seed of
        their own; the outcome is cached, so that a task keeps its levels on this machine)."""
        from importlib.metadata import version

        path = cache_path({"dataset": self.dataset, "probe": True, "rg": version("reasoning-gym"), **PROBE_RULE})
        known = read_cache(path)
        todo = [lv for lv in self.levels if repr(lv.attr_values) not in known]
        if todo:
            progress = Progress(f"{self.name}: checking its levels, level")
            for k, (lv, why) in enumerate(probe_cells(self.dataset, todo)):
                known[repr(lv.attr_values)] = why
                progress.step(k + 1, len(todo))
            write_cache(path, known)
        self._lv.drop({lv.index: known[repr(lv.attr_values)] for lv in self.levels if known[repr(lv.attr_values)]})

    # ------------------------------------------------------------------ generation

    def _rg_dataset(self, level: int, n: int, seed: int):
        key = (level, n, seed)
        ds = self._datasets.get(key)
        if ds is None:
            ds = make_dataset(self.dataset, self.levels[level].attr_levels, n, seed)
            if len(self._datasets) > 256:
                self._datasets.clear()
            self._datasets[key] = ds
        return ds

    def _check_level(self, level: int) -> None:
        if not 0 <= level < len(self.levels):
            raise RgTaskError(f"task {self.name!r}: level {level}: allowed: 0-{len(self.levels) - 1}")

    def draw(self, level: int, n: int, seed: int, seen: set[str]) -> Draw:
        """`n` distinct questions of `level` whose text is not in `seen` (`seen` grows by them)."""
        self._check_level(level)
        return draw(lambda size, s: self._rg_dataset(level, size, s), self.dataset, level, n, seed, seen)

    def level_items(self, level: int, n: int, seed: int, avoid: set[str] | None = None) -> list[RgItem]:
        """`n` questions of `level` from `seed`, none of whose text is in `avoid` (fewer where it has no more)."""
        return self.draw(level, n, seed, set(avoid or ())).items

    def generate(self, config: RgConfig, n: int, seed: int) -> tuple[list[RgItem], dict[str, Any]]:
        """A stage's `n` questions, spread over the config's levels by their shares (largest remainders), in a
        shuffled order; none repeats a question of the fixed splits, and none repeats another (a question two
        levels share is drawn at the lower one). A level that has fewer distinct questions left is `short`."""
        counts = allocate(config.levels, n)
        for lv in counts:
            self._check_level(lv)
        seen = self.split_questions()
        items: list[RgItem] = []
        short: dict[str, int] = {}
        progress = Progress(f"{self.name}: drawing {n} questions, level")
        for j, (level, k) in enumerate(counts.items()):
            progress.step(j, len(counts))
            if k:
                got = self.draw(level, k, mix(seed, level), seen)
                items.extend(got.items)
                if got.short:
                    short[str(level)] = got.short
        random.Random(seed).shuffle(items)
        figures = {"requested": {str(k): v for k, v in counts.items()},
                   "generated": {str(lv): sum(1 for i in items if i.level == lv) for lv in counts}, "short": short}
        if short:
            print(f"{self.name}: short of distinct questions: "
                  + ", ".join(f"level {lv} gave {figures['generated'][lv]} of {counts[int(lv)]}" for lv in short),
                  file=sys.stderr, flush=True)
        return items, figures

    def split(self, name: str) -> list[RgItem]:
        """The fixed split `name` (val or test): `SPLIT_SIZES[name]` questions per level."""
        if name not in SPLIT_SIZES:
            raise RgTaskError(f"split {name!r}: allowed for rg tasks: {', '.join(SPLIT_SIZES)}")
        return list(self._splits[name])

    def _split_state(self) -> tuple[Path, dict]:
        """The cache file of the fixed splits and what it holds: its `spec`, `splits` (split -> level -> rows), `cpu`
        (level -> the CPU seconds its `val` questions took) and `cut` (the load budget's first dropped level, or None;
        absent until every `val` level is drawn). A file of another spec is not read."""
        from importlib.metadata import version

        spec = {"dataset": self.dataset, "levels": [repr(lv.attr_values) for lv in self._lv.levels],
                "sizes": SPLIT_SIZES, "seeds": SPLIT_SEEDS, "rg": version("reasoning-gym"), "load_cpu_s": LOAD_CPU_S}
        path = cache_path(spec)
        cached = read_cache(path)
        state = cached if cached.get("spec") == spec else {"spec": spec}
        state.setdefault("splits", {}).setdefault("val", {})
        state.setdefault("cpu", {})
        return path, state

    def _fit_load_budget(self) -> None:
        """Draw the `val` split level after level (cached after each), and drop the levels from the first one that
        would bring the fixed splits over `LOAD_CPU_S` of CPU, estimated from each level's `val` questions (the
        first level is always kept). A dataset within the budget keeps every level and the same questions."""
        path, state = self._split_state()
        self._state = path, state
        val, cpu = state["splits"]["val"], state["cpu"]
        per = SPLIT_SIZES["val"]
        scale = sum(SPLIT_SIZES.values()) / per  # a level's splits over its `val` questions
        if "cut" not in state:
            taken = {row["question"] for rows in val.values() for row in rows}
            total = scale * sum(cpu.values())
            n = len(self._lv.levels)
            jobs = [(lv, per, mix(SPLIT_SEEDS["val"], lv)) for lv in range(n) if str(lv) not in val]
            progress = Progress(f"{self.name}: drawing the fixed val split (cached for next time), level")
            state["cut"] = None
            with Ahead(self._rg_dataset, self.dataset, jobs) as ahead:  # the levels' questions drawn on every core
                for lv, _, seed in jobs:
                    got = ahead.draw(lv, per, seed, set(taken))
                    est = scale * got.cpu_s
                    if lv > 0 and total + est > LOAD_CPU_S:
                        state["cut"] = {"level": lv, "note": (
                            f"with it the task's fixed splits would take about {total + est:.0f} s of CPU to draw "
                            f"({got.cpu_s / per:.2f} s a question, timed on its {per} val questions); allowed: "
                            f"{LOAD_CPU_S:g} s a task (the first level over it and those after it are dropped)")}
                        break
                    total += est
                    taken.update(i.question for i in got.items)
                    val[str(lv)], cpu[str(lv)] = [item_dict(i) for i in got.items], got.cpu_s
                    write_cache(path, state)
                    progress.step(lv + 1, n)
            write_cache(path, state)
        cut = state["cut"]
        if cut:
            first = cut["level"]
            later = f"a level after {self.levels[first].label}, the first one over the task's load budget"
            self._lv.drop({lv.index: cut["note"] if lv.index == first else later for lv in self.levels[first:]})

    @cached_property
    def _splits(self) -> dict[str, list[RgItem]]:
        """`val` (drawn when the task is made) then `test`, level by level, each avoiding every question drawn
        before it; cached on disk after every level, so that an interrupted draw resumes where it stopped."""
        path, state = self._state
        done = state["splits"]
        taken: set[str] = set()
        out: dict[str, list[RgItem]] = {}
        jobs = [(lv, per, mix(SPLIT_SEEDS[name], lv)) for name, per in SPLIT_SIZES.items()
                for lv in range(len(self.levels)) if str(lv) not in done.get(name, {})]
        progress = Progress(f"{self.name}: drawing the fixed splits (cached for next time), level")
        with Ahead(self._rg_dataset, self.dataset, jobs) as ahead:  # the levels' questions drawn on every core
            for name, per in SPLIT_SIZES.items():
                items: list[RgItem] = []
                for lv in range(len(self.levels)):
                    rows = done.get(name, {}).get(str(lv))
                    if rows is None:
                        got = ahead.draw(lv, per, mix(SPLIT_SEEDS[name], lv), taken)
                        done.setdefault(name, {})[str(lv)] = [item_dict(i) for i in got.items]
                        write_cache(path, state)
                        items.extend(got.items)
                        progress.step(lv + 1, len(self.levels), name)
                    else:
                        got_items = [item_of(r) for r in rows]
                        taken.update(i.question for i in got_items)
                        items.extend(got_items)
                out[name] = items
        return out

    def split_questions(self) -> set[str]:
        return {i.question for items in self._splits.values() for i in items}

    # ------------------------------------------------------------------ the trainer's seam (trainer.task.Task)

    def item_to_json(self, item: RgItem) -> str:
        import json

        return json.dumps(item_dict(item), sort_keys=True)

    def item_from_json(self, text: str) -> RgItem:
        import json

        return item_of(json.loads(text))

    def item_id(self, item: RgItem) -> str:
        return item.id

    def level(self, item: RgItem) -> int:
        return item.level

    def prompt(self, item: RgItem, style: str = "compact") -> list[dict]:
        return [{"role": "user", "content": f"{item.question}\n{ANSWER_HINT}"}]

    def gold(self, item: RgItem) -> str:
        return item.answer

    def warm_start_items(self, levels: list[int] | None, n: int, seed: int) -> list[RgItem]:
        """`n` fresh questions spread evenly over `levels` (None: every level; the trainer checks them against the
        task's levels, `trainer.sft.check_levels`), none in a fixed split."""
        chosen = sorted(set(levels)) if levels else list(range(len(self.levels)))
        share = {lv: 1 / len(chosen) for lv in chosen}
        items, _ = self.generate(RgConfig(levels=share, num_instances=n), n, seed=mix(seed, 104_729))
        return items

    def answer_of(self, text: str, item: RgItem | None = None) -> str:
        """The answer in a completion (`extract`); without an item, as for a one-line gold."""
        return extract(text, item.answer if item is not None else "")

    def score(self, item: RgItem, answer: str) -> float:
        """The dataset's own scorer on an extracted answer, in [0, 1] (0 where it cannot read the answer)."""
        ds = self._scorers.get(item.level)
        if ds is None:
            ds = self._scorers[item.level] = self._rg_dataset(item.level, 1, 0)
        try:
            return min(1.0, max(0.0, float(ds.score_answer(answer, item.entry()))))
        except Exception:  # a scorer that cannot read the answer (e.g. unparsable) gives it no credit
            return 0.0

    def verify(self, item: RgItem, text: str) -> TaskVerdict:
        answer = self.answer_of(text, item)
        if not answer:
            return TaskVerdict(False, "no_answer", 0.0, False)
        score = self.score(item, answer)
        if score >= 1.0:
            return TaskVerdict(True, None, 1.0, True)
        return TaskVerdict(False, "partial" if score > 0 else "wrong", score, False)

    # ------------------------------------------------------------------ what the loop shows the engineer

    def describe_levels(self) -> str:
        """A markdown table of the levels, from the dataset's curriculum (for the engineer's prompt)."""
        attrs = self.attributes_in_grid()
        lines = ["| level | " + " | ".join(attrs) + " |", "|---|" + "---|" * len(attrs)]
        for lv in self.levels:
            lines.append(f"| {lv.index} | " + " | ".join(value_text(v) for _, v in lv.attr_values) + " |")
        return "\n".join(lines)

    def attributes_in_grid(self) -> list[str]:
        return [a for a, _ in self.levels[0].attr_values]

    def describe_attributes(self) -> str:
        """Each attribute of the task's levels, with the values its levels use (a narrowed task shows only its own
        range, never the dataset's whole curriculum)."""
        used: dict[str, set[int]] = {}
        for level in self.levels:
            for a, lv in level.attr_levels:
                used.setdefault(a, set()).add(lv)
        return "\n".join(f"- `{a}`: {desc or 'a difficulty attribute'} (levels "
                         f"{', '.join(value_text(levels[i]) for i in sorted(used.get(a, ())))})"
                         for a, (levels, desc) in self.attributes.items() if a in self.attributes_in_grid())

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
        """A random stage-0 config: 1-3 levels from the easier half of the levels, random shares."""
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


def main(argv: list[str] | None = None) -> int:
    from .rg_list import main as list_main

    return list_main(argv, RgTask)


if __name__ == "__main__":
    raise SystemExit(main())
