"""One MAPF-FrozenLake instance and its JSON-lines storage.

An instance is plain data: the terrain (`grid`, rows of ``F`` ice and ``H`` holes; starts and goals are
kept apart from the terrain), the agents' starts and goals as 0-indexed ``(row, col)``, an optimal plan
from the solver, its sum of costs and makespan, the optimal makespan (`optimal_makespan`, from an exact
makespan search: it can be shorter than the sum-of-costs plan's), each agent's independent shortest
distance, whether the
optimum needs a wait (`needs_wait`: optimal sum of costs > sum of shortest distances) and the seed it was
generated from. One JSON object per line in ``.jsonl`` files; `to_json` is byte-stable.

An `Instance` checks its own shape when built or read: 1..5 agents, as many goals (and plan paths and
shortest distances, when given) as starts, a square grid of side `size` made of ``F`` and ``H``, and every
start, goal and plan cell on the map. So a malformed line fails where it is read, naming the field and
value, instead of crashing `show` or `verify` later.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .config import MAX_AGENTS

Cell = tuple[int, int]


class Instance(BaseModel):
    """A MAPF-FrozenLake problem with its proven-optimal solution."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="unique id within its file")
    size: int = Field(ge=1, description="the map is size x size")
    grid: list[str] = Field(description="terrain rows: 'F' ice, 'H' hole")
    starts: list[Cell] = Field(description="start (row, col) per agent")
    goals: list[Cell] = Field(description="goal (row, col) per agent")
    plan: list[list[Cell]] = Field(description="an optimal path per agent, start to goal (waits repeat a cell)")
    optimal_cost: int = Field(ge=0, description="optimal sum of costs (each agent's last arrival time at its goal)")
    makespan: int = Field(ge=0, description="time at which the last agent of `plan` arrives for good")
    optimal_makespan: int | None = Field(
        None, ge=0, description="the least makespan of any conflict-free plan (the paper's \"makespan-optimal\"); "
        "it can be shorter than `makespan`, the sum-of-costs optimum's. None: not computed (instances from "
        "before env 1.1.0)")
    shortest: list[int] = Field(description="each agent's shortest start-goal distance, ignoring the others")
    needs_wait: bool = Field(description="optimal_cost > sum(shortest): agents must wait or detour")
    seed: int = Field(description="the seed this instance was drawn from")
    tags: dict[str, float | int | str] = Field(default_factory=dict, description="subset labels, e.g. agents, wait")

    @model_validator(mode="after")
    def _check_shape(self) -> Instance:
        k, n = len(self.starts), self.size
        if not 1 <= k <= MAX_AGENTS:
            raise ValueError(f"starts: {k} agents; an instance has 1..{MAX_AGENTS} agents")
        if len(self.goals) != k:
            raise ValueError(f"goals: {len(self.goals)} goals for {k} starts; each agent needs one start and one goal")
        if self.plan and len(self.plan) != k:
            raise ValueError(f"plan: {len(self.plan)} paths for {k} agents; give one path per agent (or none)")
        if self.shortest and len(self.shortest) != k:
            raise ValueError(f"shortest: {len(self.shortest)} distances for {k} agents; give one per agent (or none)")
        if len(self.grid) != n:
            raise ValueError(f"grid: {len(self.grid)} rows, but size is {n}; the grid is size x size")
        for r, row in enumerate(self.grid):
            if len(row) != n:
                raise ValueError(f"grid.{r}: row {row!r} has {len(row)} cells, but size is {n}")
            if row.strip("FH"):
                raise ValueError(f"grid.{r}: row {row!r} has a cell other than 'F' (ice) or 'H' (hole)")
        for name, cells in (("starts", self.starts), ("goals", self.goals)):
            for i, (r, c) in enumerate(cells):
                if not (0 <= r < n and 0 <= c < n):
                    raise ValueError(f"{name}.{i}: ({r}, {c}) is off the {n}x{n} map (rows and columns 0..{n - 1})")
        for i, path in enumerate(self.plan):
            if not path:
                raise ValueError(f"plan.{i}: the path is empty; it must start at starts.{i}")
            for t, (r, c) in enumerate(path):
                if not (0 <= r < n and 0 <= c < n):
                    raise ValueError(f"plan.{i}.{t}: ({r}, {c}) is off the {n}x{n} map (rows and columns 0..{n - 1})")
        return self

    @property
    def num_agents(self) -> int:
        return len(self.starts)

    @property
    def hole_ratio(self) -> float:
        return sum(row.count("H") for row in self.grid) / (self.size * self.size)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, line: str) -> Instance:
        return cls.model_validate_json(line)


def format_instance_error(err: Exception) -> str:
    """One line for a pydantic `ValidationError` on an instance (field path, message, value) or any error."""
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return str(err)
    parts = []
    for e in errors():
        loc = ".".join(str(x) for x in e.get("loc", ()))
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        inp = e.get("input")
        shown = "" if isinstance(inp, dict | list) or inp is None else f" (got {inp!r})"
        parts.append(f"{loc}: {msg}{shown}" if loc else msg)
    return "; ".join(parts)


def read_jsonl(path: str | os.PathLike, *, unique_ids: bool = False) -> list[Instance]:
    """Read instances, one JSON object a line; blank lines are skipped.

    Raises `ValueError` naming the file and line for a line that is not UTF-8, not JSON or not a valid
    instance, and, with `unique_ids`, for an id that an earlier line already used. `OSError` passes through.
    """
    out = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:
        for no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{no}: not valid UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                                 f"{e.start + 1}); instance files are UTF-8 JSON lines") from None
            if not line.strip():
                continue
            try:
                inst = Instance.from_json(line)
            except ValueError as e:
                raise ValueError(f"{path}:{no}: not a valid instance: {format_instance_error(e)}") from None
            if unique_ids:
                if inst.id in first_line:
                    raise ValueError(f"{path}:{no}: duplicate instance id {inst.id!r} (first on line "
                                     f"{first_line[inst.id]}); ids must be unique within a file")
                first_line[inst.id] = no
            out.append(inst)
    return out


def atomic_write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Write lines to a temp file next to `path` and rename it into place: no partial file on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line)
                f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_jsonl(path: str | os.PathLike, instances: Iterable[Instance]) -> None:
    """Write instances one per line, atomically."""
    atomic_write_lines(path, (i.to_json() for i in instances))


def dumps(obj) -> str:
    """Compact, key-order-preserving JSON for verdicts and answers."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
