"""An eval's config file: the fields every loop eval shares, how a YAML or TOML file becomes one, and the
repository paths its fields are relative to.

`compare_engineers.py` and `ablate_context.py` each extend `LoopConfig` with the fields of their arms; a
config opens with a comment holding the command that runs it (`config_command`), which the tables show.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

REPO_ROOT = Path(__file__).resolve().parent.parent
ConfigT = TypeVar("ConfigT", bound=BaseModel)  # an eval's config model; load_config returns an instance of it


class EvalConfigError(ValueError):
    """A bad eval config: one line naming the file, the field, the value and what is allowed."""


class LoopConfig(BaseModel):
    """Fields every loop eval (compare, ablate) shares. Paths are relative to the repository root."""

    model_config = ConfigDict(extra="forbid")

    preset: str = Field("smoke", description="graph.run preset: smoke | cpu | cpu-long | paper (same budget for "
                        "every arm)")
    seeds: list[int] = Field(description="seeds; each gives every arm the same stage-0 config and data")
    out: Path = Field(description="folder of the tables, plots, logs and copied verdict files")
    runs_dir: Path | None = Field(None, description="parent of the run folders (default: runs/evals/<out name>)")
    baseline: str | None = Field(None, description="arm that gaps are measured against (None: no gap columns)")
    set: dict[str, Any] = Field(
        default_factory=dict, description="settings passed identically to every run as --set KEY=VALUE"
    )
    criterion: Literal["soc", "makespan"] | None = Field(
        None, description="what `optimal` means in the tables: soc (sum of costs) or makespan (None: makespan when "
        "every verdict row has the makespan fields, else soc); named in every table"
    )
    published: bool | None = Field(
        None, description="print the paper's published rows beneath ours (None: when every run's benchmark is "
        "the full `test` split, where the paper's numbers compare)"
    )
    timeout_s: float | None = Field(None, gt=0, description="wall-clock limit of one graph.run call (None: none)")
    caveat: str | None = Field(
        None, description="what a reader must know before reading these tables (e.g. what they turned out to "
        "measure), printed in bold under the title of each table and kept in table.json"
    )
    share_stage0: bool = Field(
        True, description="train each seed's engineer-independent stage 0 once: the seed's first run is the "
        "donor, later new runs of that seed start with graph.run --stage0-from <donor> (false: every run in full)"
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        from graph.settings import PRESETS

        if v not in PRESETS:
            raise ValueError(f"preset {v!r} is not a graph.run preset; allowed: {', '.join(PRESETS)}")
        return v

    def resolved_runs_dir(self) -> Path:
        return repo_path(self.runs_dir) if self.runs_dir else REPO_ROOT / "runs" / "evals" / Path(self.out).name

    def resolved_out(self) -> Path:
        return repo_path(self.out)


LoopConfigT = TypeVar("LoopConfigT", bound=LoopConfig)  # a script's own config, kept through retargeting


def repo_path(p: Path | str) -> Path:
    p = Path(p)
    return p if p.is_absolute() else REPO_ROOT / p


def repo_relative(p: Path) -> str:
    """A path relative to the repository when it is inside it (what timings.json and the plan show)."""
    try:
        return str(Path(p).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def config_command(path: Path) -> str | None:
    """The command in the config's opening comment (`# python -m evals....`), or None."""
    for line in Path(path).read_text().splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            return s.lstrip("#").strip() or None
        return None
    return None


def load_config(path: str | os.PathLike, model: type[ConfigT]) -> ConfigT:
    """Read a YAML (or TOML) eval config into `model`; raise `EvalConfigError` with one readable line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise EvalConfigError(f"cannot read config {path}: {e.strerror}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(text)
        else:
            raw = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one line
        raise EvalConfigError(f"config {path} is not valid {path.suffix[1:] or 'YAML'}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise EvalConfigError(f"config {path}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        known = ", ".join(model.model_fields)
        hint = f"; known fields: {known}" if err["type"] == "extra_forbidden" else ""
        raise EvalConfigError(f"config {path}: field {loc}={err.get('input')!r}: {err['msg']}{hint}") from None
