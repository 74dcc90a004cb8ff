"""The levels of a reasoning-gym task (`env.rg`): its name, its grid or ladder of curriculum cells, and the
reasoning-gym config of each cell.

A dataset's curriculum (`reasoning_gym.factory.CURRICULA`) names its difficulty attributes, each with a list of
levels. A *cell* sets every attribute to one of its levels; reasoning-gym resolves it to a config in its
`upper_bound` mode (a range attribute takes its top segment). A task's levels are cells, numbered from 0:

- `grid`: every cell of the attributes' product, the first attribute varying slowest. The default where the grid
  has at most `MAX_LEVELS` cells.
- `ladder`: at most `MAX_LADDER` cells from easiest to hardest, every attribute stepping up together (attribute
  `a` with `n_a` levels is at level `round(k * (n_a - 1) / (L - 1))` on rung `k` of `L`). The default where the
  grid is larger.

A task name narrows attributes to the values it lists and may pick the kind:
`rg:<dataset>[:attr=lo-hi,attr=v,...][,levels=grid|ladder]` (values as `python -m env.rg --list` shows them).
Cells that resolve to the same config count once. A cell whose config reasoning-gym's own check refuses is
dropped, with a note naming it (`RgLevels.dropped`); a dataset left with no cell is refused in one line.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_LEVELS = 25  # the most cells of a default grid: an engineer reads and allocates every one, and each has fixed
# splits of 72 questions to draw at the task's first load (zebra_puzzles' 36 cells: over 3 minutes on 2 cores)
MAX_LADDER = 8  # the most rungs of a default ladder
MAX_GRID = 400  # the most cells of a grid asked for by name (`levels=grid`): each cell has its own fixed splits
KINDS = ("grid", "ladder")


class RgTaskError(ValueError):
    """A task name, attribute or level that the dataset does not have (one line naming what is allowed)."""


def value_text(v: Any) -> str:
    """A level's value as a name writes it: `2`, `0.5`, `1-2` (a range), `1/0/0` (a list)."""
    if isinstance(v, tuple):
        return "-".join(value_text(x) for x in v)
    if isinstance(v, list):
        return "/".join(value_text(x) for x in v)
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Level:
    """One cell of a task's levels: each attribute's level index, and the values reasoning-gym resolves."""

    index: int
    attr_levels: tuple[tuple[str, int], ...]
    attr_values: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return " ".join(f"{a}={value_text(v)}" for a, v in self.attr_values)


def parse_name(name: str) -> tuple[str, dict[str, list[str]]]:
    """`rg:<dataset>[:attr=lo-hi,attr=v,levels=ladder]` -> (dataset, {attr: [lo, hi] or [v]}). An attribute
    given twice is refused (no silent last-one-wins)."""
    if not name.startswith("rg:"):
        raise RgTaskError(f"task {name!r}: a reasoning-gym task is named rg:<dataset>[:attr=lo-hi,...]")
    dataset, _, spec = name[3:].partition(":")
    narrow: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        attr, eq, values = part.partition("=")
        attr, values = attr.strip(), values.strip()
        if not eq or not attr or not values:
            raise RgTaskError(f"task {name!r}: {part!r} is not attr=value or attr=lo-hi")
        if attr in narrow:
            raise RgTaskError(f"task {name!r}: {attr} is given twice; allowed: each attribute once")
        m = re.fullmatch(r"(-?[^-]+)-(-?[^-]+)", values)
        narrow[attr] = [m.group(1), m.group(2)] if m else [values]
    return dataset, narrow


def datasets_with_curriculum() -> list[str]:
    import reasoning_gym  # noqa: F401  (registers the datasets)
    from reasoning_gym.factory import CURRICULA

    return sorted(CURRICULA)


def ladder_cells(sizes: list[int], rungs: int | None = None) -> list[tuple[int, ...]]:
    """Rung k of a ladder over attributes with `sizes` levels: each attribute's index, stepping up together.

    >>> ladder_cells([5, 2, 3], 4)
    [(0, 0, 0), (1, 0, 1), (3, 1, 1), (4, 1, 2)]
    """
    n = rungs or min(MAX_LADDER, max(sizes))
    if n <= 1:
        return [tuple(0 for _ in sizes)]
    return [tuple(math.floor(k * (s - 1) / (n - 1) + 0.5) for s in sizes) for k in range(n)]


class RgLevels:
    """The levels of `rg:<dataset>[:...]` (see the module docstring): `levels`, `dropped`, `kind`, `attributes`."""

    def __init__(self, name: str):
        import reasoning_gym  # noqa: F401  (registers the datasets)
        from reasoning_gym.factory import CURRICULA, DATASETS

        dataset, narrow = parse_name(name)
        if dataset not in CURRICULA:
            extra = " (it has no curriculum)" if dataset in DATASETS else ""
            raise RgTaskError(f"task {name!r}: unknown reasoning-gym dataset {dataset!r}{extra}; allowed: "
                              f"{', '.join(sorted(CURRICULA))} (python -m env.rg --list)")
        self.name, self.dataset = name, dataset
        attrs = CURRICULA[dataset]().attributes
        kind = narrow.pop("levels", None)
        if kind is not None and (len(kind) != 1 or kind[0] not in KINDS):
            raise RgTaskError(f"task {name!r}: levels={'-'.join(kind)}; allowed: levels={' or levels='.join(KINDS)}")
        for attr in narrow:
            if attr not in attrs:
                raise RgTaskError(f"task {name!r}: {dataset} has no attribute {attr!r}; allowed: "
                                  f"{', '.join(attrs)} (and levels={'|'.join(KINDS)})")
        self.attributes = {a: (list(d.levels), d.description or "") for a, d in attrs.items()}
        axes = [(a, _narrow(name, a, list(enumerate(d.levels)), narrow[a]) if a in narrow
                 else list(enumerate(d.levels))) for a, d in attrs.items()]
        grid = math.prod(len(p) for _, p in axes)
        self.kind = kind[0] if kind else ("grid" if grid <= MAX_LEVELS else "ladder")
        if self.kind == "grid":
            if grid > MAX_GRID:
                raise RgTaskError(f"task {name!r}: its grid has {grid:,} cells, more than {MAX_GRID}; allowed: "
                                  f"narrow it (e.g. rg:{dataset}:{_example(axes)},levels=grid) or its default ladder")
            cells = list(itertools.product(*(range(len(p)) for _, p in axes)))
        else:
            cells = ladder_cells([len(p) for _, p in axes])
        self.grid_cells = grid
        self.levels: list[Level] = []
        self.dropped: list[str] = []  # "attr=v ...: why", one per refused cell
        seen: set[str] = set()
        for cell in cells:
            attr_levels = tuple((a, p[i][0]) for (a, p), i in zip(axes, cell, strict=True))
            values = resolved(dataset, attr_levels)
            key = repr(values)
            if key in seen:  # an interval attribute's top level repeats the one below it: one cell
                continue
            seen.add(key)
            lv = Level(len(self.levels), attr_levels, values)
            why = config_error(dataset, attr_levels)
            if why:
                self.dropped.append(f"{lv.label}: {why}")
                continue
            self.levels.append(lv)
        if not self.levels:
            raise RgTaskError(f"task {name!r}: reasoning-gym refuses every cell of {dataset}'s {self.kind} "
                              f"({self.dropped[0]}); allowed: a dataset or narrowing with a usable cell")

    def drop(self, why: dict[int, str]) -> None:
        """Drop the levels `why` names (level -> why its questions cannot be used), renumbering the rest."""
        kept = []
        for lv in self.levels:
            if lv.index in why:
                self.dropped.append(f"{lv.label}: {why[lv.index]}")
            else:
                kept.append(Level(len(kept), lv.attr_levels, lv.attr_values))
        self.levels = kept


def _example(axes) -> str:
    a, pairs = axes[0]
    return f"{a}={value_text(pairs[0][1])}-{value_text(pairs[min(2, len(pairs) - 1)][1])}"


def _narrow(name: str, attr: str, pairs: list[tuple[int, Any]], values: list[str]) -> list[tuple[int, Any]]:
    shown = [value_text(v) for _, v in pairs]
    idx = []
    for v in values:
        if v not in shown:
            raise RgTaskError(f"task {name!r}: {attr}={v} is not one of its levels; allowed: {', '.join(shown)}")
        idx.append(shown.index(v))
    return pairs[min(idx):max(idx) + 1]


def curriculum_at(dataset: str, attr_levels: tuple[tuple[str, int], ...]):
    from reasoning_gym.factory import CURRICULA

    cur = CURRICULA[dataset]()
    for attr, lv in attr_levels:
        cur.set_attr_level(attr, lv)
    return cur


def _context():
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

    return DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)


def resolved(dataset: str, attr_levels: tuple[tuple[str, int], ...]) -> tuple[tuple[str, Any], ...]:
    """What a cell generates: each attribute's value, or its (low, high) range, as reasoning-gym resolves it."""
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition

    cur, ctx = curriculum_at(dataset, attr_levels), _context()
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


def rg_config(dataset: str, attr_levels: tuple[tuple[str, int], ...], size: int, seed: int):
    """reasoning-gym's config of a cell, `size` items from `seed`, checked by its own `validate`."""
    cfg = curriculum_at(dataset, attr_levels).generate_configuration({"size": max(1, size), "seed": seed},
                                                                     _context())
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def make_dataset(dataset: str, attr_levels: tuple[tuple[str, int], ...], size: int, seed: int):
    """reasoning-gym's dataset of a cell: `create_dataset` with the curriculum's config of the cell."""
    from dataclasses import fields

    from reasoning_gym import create_dataset

    cfg = rg_config(dataset, attr_levels, size, seed)
    return create_dataset(dataset, **{f.name: getattr(cfg, f.name) for f in fields(cfg)})


def config_error(dataset: str, attr_levels: tuple[tuple[str, int], ...]) -> str | None:
    """Why reasoning-gym's config check refuses a cell (None: it accepts it)."""
    try:
        rg_config(dataset, attr_levels, 1, 0)
    except Exception as e:  # reasoning-gym's checks raise AssertionError or ValueError
        return one_line(e)
    return None


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {text[:160]}"
