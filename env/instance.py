"""One MAPF-FrozenLake instance and its JSON-lines storage.

An instance is plain data: the terrain (`grid`, rows of ``F`` ice and ``H`` holes; starts and goals are
kept apart from the terrain), the agents' starts and goals as 0-indexed ``(row, col)``, an optimal plan
from the solver, its sum of costs and makespan, each agent's independent shortest distance, whether the
optimum needs a wait (`needs_wait`: optimal sum of costs > sum of shortest distances) and the seed it was
generated from. One JSON object per line in ``.jsonl`` files; `to_json` is byte-stable.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

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
    shortest: list[int] = Field(description="each agent's shortest start-goal distance, ignoring the others")
    needs_wait: bool = Field(description="optimal_cost > sum(shortest): agents must wait or detour")
    seed: int = Field(description="the seed this instance was drawn from")
    tags: dict[str, float | int | str] = Field(default_factory=dict, description="subset labels, e.g. agents, wait")

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


def read_jsonl(path: str | os.PathLike) -> list[Instance]:
    """Read instances, one JSON object a line; blank lines are skipped. Errors name the line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Instance.from_json(line))
            except ValueError as e:
                first = str(e).splitlines()
                raise ValueError(f"{path}:{no}: not a valid instance: {' '.join(first[:3])}") from None
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
