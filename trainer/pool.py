"""A pool of tasks as one level-share task: `TASK=pool:rg:basic_arithmetic,rg:count_bits,rlve:multiplication`.

The pool's levels are every member's levels, member after member, numbered 0, 1, ... (a member's own order kept),
each labelled `<member> <its level>: <its label>`; the engineer allocates shares over these (task, level) pairs
across families. An item is a member's item with the member's name; its prompt, gold answer and verdict are the
member's own. A stage's data is each member's `generate` on the shares of its levels (the pool's shares, rescaled
within the member), mixed and shuffled; the fixed splits are the members' splits; the failure labels are the
union of the members'. `level_groups` gives each member's levels in its own order, so that the classic curricula
run per task (`families/level_share.py` `classic`) and the final table has a row per task and one for the whole.

Members are separated by a comma before another task name (`rg:`, `rlve:` or `package.module:Attribute`); a
comma inside a member's own name (`rg:basic_arithmetic:num_terms=2-3,num_digits=1`) stays with it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from env.rg import RgConfig, allocate

MAX_MEMBERS = 8


@dataclass(frozen=True)
class PoolLevel:
    index: int
    member: int
    own: int  # the member's own level index
    label: str


@dataclass(frozen=True)
class PoolItem:
    """A member's item, and its level in the pool (what an evaluation cap spreads over)."""

    member: int
    item: Any
    level: int = -1


def member_names(name: str) -> list[str]:
    """`pool:a,b,c` -> its members' task names."""
    if not name.startswith("pool:") or not name[5:].strip():
        raise ValueError(f"task {name!r}: a pool is named pool:<task>,<task>,... (e.g. pool:rg:count_bits,"
                         "rlve:Multiplication)")
    names = [p.strip() for p in re.split(r",(?=\s*[A-Za-z_][\w.]*:)", name[5:])]
    if len(names) < 2 or len(names) > MAX_MEMBERS or len(set(names)) != len(names):
        raise ValueError(f"task {name!r}: {len(names)} member(s) {names}; allowed: 2 to {MAX_MEMBERS} different tasks")
    return names


class PoolTask:
    """Several level-share tasks as one (see the module docstring)."""

    level_word = "level"
    split_names = ("val", "test")

    def __init__(self, name: str, load_task: Callable[[str], Any]):
        """`load_task` loads a member by its name (`trainer.task.load_task`)."""
        self.name = name
        self.member_names = member_names(name)
        self.members = []
        for m in self.member_names:
            if m.startswith("pool:"):
                raise ValueError(f"task {name!r}: member {m!r}: a pool cannot hold a pool")
            try:
                task = load_task(m)
            except ValueError as e:
                raise ValueError(f"task {name!r}: member {str(e).splitlines()[0]}") from None
            lacking = [a for a in ("levels", "generate", "split", "split_names") if not hasattr(task, a)]
            if lacking:
                raise ValueError(f"task {name!r}: member {m!r} has no {lacking[0]}; allowed: level-share tasks "
                                 "(rg:, rlve:, or a task with the members of docs/tasks.md)")
            missing = [s for s in self.split_names if s not in task.split_names]
            if missing:
                raise ValueError(f"task {name!r}: member {m!r} has no split {missing[0]!r}; allowed: tasks with "
                                 f"{', '.join(self.split_names)} splits")
            self.members.append(task)
        self.levels: list[PoolLevel] = []
        self.level_groups: list[list[int]] = []
        for k, task in enumerate(self.members):
            group = []
            for lv in task.levels:
                g = len(self.levels)
                self.levels.append(PoolLevel(g, k, int(lv.index), f"{self.member_names[k]} L{lv.index}: {lv.label}"))
                group.append(g)
            self.level_groups.append(group)
        self._global = {(lv.member, lv.own): lv.index for lv in self.levels}
        self.failure_labels = tuple(dict.fromkeys(f for t in self.members for f in t.failure_labels))

    def group_names(self) -> list[str]:
        return list(self.member_names)

    # ------------------------------------------------------------------ items

    def item_to_json(self, item: PoolItem) -> str:
        return json.dumps({"member": item.member, "item": self.members[item.member].item_to_json(item.item)})

    def item_from_json(self, text: str) -> PoolItem:
        d = json.loads(text)
        return self._wrap(int(d["member"]), self.members[int(d["member"])].item_from_json(d["item"]))

    def _wrap(self, member: int, item: Any) -> PoolItem:
        return PoolItem(member, item, self._global[(member, int(self.members[member].level(item)))])

    def item_id(self, item: PoolItem) -> str:
        return f"m{item.member}-{self.members[item.member].item_id(item.item)}"

    def level(self, item: PoolItem) -> int:
        return item.level

    def prompt(self, item: PoolItem, style: str = "compact") -> list[dict]:
        return self.members[item.member].prompt(item.item, style)

    def gold(self, item: PoolItem) -> str:
        return self.members[item.member].gold(item.item)

    def verify(self, item: PoolItem, text: str):
        return self.members[item.member].verify(item.item, text)

    def warm_start_items(self, levels: list[int] | None, n: int, seed: int) -> list[PoolItem]:
        """`n` fresh items, an equal part from each member's own warm start."""
        parts = allocate({k: 1 / len(self.members) for k in range(len(self.members))}, n)
        items = [self._wrap(k, it) for k, t in enumerate(self.members)
                 for it in t.warm_start_items(None, parts[k], _mix(seed, k))]
        random.Random(seed).shuffle(items)
        return items

    # ------------------------------------------------------------------ the loop's members

    def generate(self, config: RgConfig, n: int, seed: int) -> tuple[list[PoolItem], dict[str, Any]]:
        """A stage's `n` items: each (task, level) pair its share (largest remainders), each member generating its
        part from its own config, mixed and shuffled."""
        counts = allocate(config.levels, n)
        items: list[PoolItem] = []
        figures: dict[str, Any] = {"requested": {str(k): v for k, v in counts.items()}, "members": {}}
        for k, task in enumerate(self.members):
            mine = {self.levels[g].own: c for g, c in counts.items() if self.levels[g].member == k and c}
            total = sum(mine.values())
            if not total:
                continue
            got, fig = task.generate(task.parse_config({"levels": {str(lv): c / total for lv, c in mine.items()}},
                                                       total), total, _mix(seed, k))
            items.extend(self._wrap(k, it) for it in got)
            figures["members"][self.member_names[k]] = fig
        random.Random(seed).shuffle(items)
        figures["generated"] = {str(g): sum(1 for i in items if self.level(i) == g) for g in counts}
        return items, figures

    def split(self, name: str) -> list[PoolItem]:
        if name not in self.split_names:
            raise ValueError(f"split {name!r}: allowed for a pool: {', '.join(self.split_names)}")
        return [self._wrap(k, it) for k, t in enumerate(self.members) for it in t.split(name)]

    def describe_attributes(self) -> str:
        return "\n".join(f"- task `{m}` (levels {g[0]}-{g[-1]} of the pool)"
                         for m, g in zip(self.member_names, self.level_groups, strict=True))

    def describe_levels(self) -> str:
        lines = ["| level | task | its level | what |", "|---|---|---|---|"]
        lines += [f"| {lv.index} | {self.member_names[lv.member]} | {lv.own} | "
                  f"{lv.label.split(': ', 1)[1]} |" for lv in self.levels]
        notes = [f"\nNote ({self.member_names[k]}): {n}" for k, t in enumerate(self.members) for n in
                 getattr(t, "notes", [])]
        return "\n".join(lines + notes)

    def parse_config(self, raw: Any, num_instances: int | None = None) -> RgConfig:
        if isinstance(raw, RgConfig):
            return raw
        allowed = f"0-{len(self.levels) - 1}"
        levels = raw.get("levels") if isinstance(raw, dict) else None
        if not isinstance(levels, dict):
            raise ValueError(f"config {raw!r}: allowed: an object {{\"levels\": {{\"<level>\": share, ...}}}}")
        extra = set(raw) - {"levels", "num_instances"}
        if extra:
            raise ValueError(f"config: unknown key(s) {', '.join(sorted(map(str, extra)))}; allowed: levels")
        shares = {}
        for k, v in levels.items():
            if not re.fullmatch(r"\d+", str(k).strip()) or int(k) >= len(self.levels):
                raise ValueError(f"levels: {k!r} is not a level; allowed: {allowed}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"levels[{k}] = {v!r}: allowed: a number in [0, 1]")
            shares[int(k)] = v
        n = num_instances if num_instances is not None else raw.get("num_instances", 64)
        return RgConfig(levels=shares, num_instances=n)

    def project(self, raw: Any) -> RgConfig:
        levels = raw.get("levels") if isinstance(raw, dict) else None
        if not isinstance(levels, dict):
            raise ValueError("no levels to project")
        kept = {int(k): float(v) for k, v in levels.items() if re.fullmatch(r"\d+", str(k).strip())
                and int(k) < len(self.levels) and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                and v != float("inf")}
        if not kept:
            raise ValueError("no level with a positive share")
        return RgConfig(levels={k: v / sum(kept.values()) for k, v in kept.items()})

    def random_config(self, seed: int, num_instances: int = 64) -> RgConfig:
        """Each member's own random stage-0 config, the members in equal parts."""
        shares: dict[int, float] = {}
        for k, t in enumerate(self.members):
            own = t.random_config(_mix(seed, k), num_instances).levels
            for lv, s in own.items():
                shares[self._global[(k, int(lv))]] = s / len(self.members)
        return RgConfig(levels=shares, num_instances=num_instances)


def _mix(seed: int, k: int) -> int:
    return int(hashlib.sha256(f"pool:{seed}:{k}".encode()).hexdigest()[:8], 16)
