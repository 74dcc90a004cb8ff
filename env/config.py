"""The environment configuration: the 24 numbers the engineer sets, and the paper's projection.

`EnvConfig` is the contract between the engineer and the generator. It validates strictly
(`EnvConfig.model_validate(raw)` raises a pydantic `ValidationError` whose messages name the field
and the bound), writes the engineer's JSON schema (`EnvConfig.engineer_schema()`) and is saved in
every stage folder. `project(raw)` is the forgiving path the paper uses for proposals: clip every
knob to [0, 1], renormalise the data ratios (uniform if they are all zero), cap each hole ratio at
`max_hole_ratio(size, num_agents)`, and report every change it made as a note. Strict validation takes
numbers only: a knob given as a string ("0.125") fails it, and `project` converts it with a note.
"""

from __future__ import annotations

import math
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SIZES: tuple[int, ...] = tuple(range(3, 11))
MAX_AGENTS = 5  # the prompt legend has symbols for 5 agents
DEFAULT_NUM_INSTANCES = 4000
_RATIO_SUM_TOL = 1e-6
_HOLE_CAP = 0.5  # above this, random maps rarely keep a component big enough to place agents in


def max_hole_ratio(size: int, num_agents: int = 2) -> float:
    """Largest hole ratio the generator serves on a `size` x `size` map with `num_agents` agents.

    The map must keep at least ``2 * num_agents + 2`` free cells (room for distinct starts, distinct
    goals and some slack to move), and never more than half of the cells are holes.

    >>> max_hole_ratio(3), max_hole_ratio(10), max_hole_ratio(3, 5)
    (0.33, 0.5, 0.0)
    """
    cells = size * size
    spare = (cells - (2 * num_agents + 2)) / cells
    return max(0.0, min(_HOLE_CAP, math.floor(spare * 100) / 100))


class SizeKnobs(BaseModel):
    """The three knobs of one map size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # strict: a JSON number only (an int is read as a float); the string "0.125" is an error here, and
    # only `project` converts it, with a note, so that no lax parse passes validation silently.
    data_ratio: float = Field(
        ge=0.0, le=1.0, strict=True, description="share of the stage's instances drawn at this size"
    )
    hole_ratio: float = Field(
        ge=0.0, le=1.0, strict=True, description="fraction of the map's cells that are holes"
    )
    wait_ratio: float = Field(
        ge=0.0,
        le=1.0,
        strict=True,
        description="share of this size's instances whose optimal plan needs a wait",
    )

    @field_validator("data_ratio", "hole_ratio", "wait_ratio", mode="before")
    @classmethod
    def _finite(cls, v: Any, info) -> Any:
        if isinstance(v, bool):
            raise ValueError(f"{info.field_name} must be a number in [0, 1], not a boolean")
        if isinstance(v, str):
            raise ValueError(f"{info.field_name} must be a JSON number in [0, 1], not a string")
        if isinstance(v, int):
            try:
                float(v)
            except OverflowError:
                raise ValueError(
                    f"{info.field_name} must be in [0, 1]; got an integer of about {_digits(v)} digits"
                ) from None
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{info.field_name} must be a finite number in [0, 1], got {v}")
        return v


class EnvConfig(BaseModel):
    """A stage's environment: knobs for every size 3..10 plus run-level fields the engineer cannot change."""

    model_config = ConfigDict(extra="forbid")

    sizes: dict[int, SizeKnobs] = Field(description="knobs per map size; exactly the sizes 3..10")
    num_agents: int = Field(default=2, ge=1, le=MAX_AGENTS, description="agents per instance (training: 2)")
    num_instances: int = Field(
        default=DEFAULT_NUM_INSTANCES, ge=1, le=1_000_000, description="instances generated per stage"
    )

    @field_validator("sizes")
    @classmethod
    def _all_sizes(cls, v: dict[int, SizeKnobs]) -> dict[int, SizeKnobs]:
        missing = [s for s in SIZES if s not in v]
        extra = sorted(s for s in v if s not in SIZES)
        if missing or extra:
            raise ValueError(
                f"sizes must have exactly the keys 3..10; missing {missing or 'none'}, unexpected {extra or 'none'}"
            )
        return {s: v[s] for s in SIZES}

    @model_validator(mode="after")
    def _ratios_sum_to_one(self) -> EnvConfig:
        total = sum(k.data_ratio for k in self.sizes.values())
        if abs(total - 1.0) > _RATIO_SUM_TOL:
            raise ValueError(f"sizes.*.data_ratio must sum to 1 (within {_RATIO_SUM_TOL:g}); they sum to {total:.10g}")
        for s, k in self.sizes.items():
            cap = max_hole_ratio(s, self.num_agents)
            if k.hole_ratio > cap + 1e-9:
                raise ValueError(
                    f"sizes.{s}.hole_ratio must be <= {cap} for a {s}x{s} map with {self.num_agents} agents; "
                    f"got {k.hole_ratio}"
                )
        return self

    def engineer_dump(self) -> dict:
        """The engineer-editable part, JSON-ready: ``{"sizes": {"3": {...}, ...}}``."""
        return {"sizes": {str(s): k.model_dump() for s, k in self.sizes.items()}}

    @classmethod
    def engineer_schema(cls) -> dict:
        """JSON schema of the engineer-editable part (the 8 sizes x 3 knobs), for structured output."""
        knob = SizeKnobs.model_json_schema()
        knob.pop("title", None)
        return {
            "type": "object",
            "properties": {
                "sizes": {
                    "type": "object",
                    "properties": {str(s): knob for s in SIZES},
                    "required": [str(s) for s in SIZES],
                    "additionalProperties": False,
                }
            },
            "required": ["sizes"],
            "additionalProperties": False,
        }


def uniform_config(hole_ratio: float = 0.2, wait_ratio: float = 0.5, num_agents: int = 2) -> EnvConfig:
    """Equal data ratios over the 8 sizes, the same hole and wait ratio everywhere (capped per size)."""
    sizes = {
        s: SizeKnobs(
            data_ratio=1.0 / len(SIZES),
            hole_ratio=min(hole_ratio, max_hole_ratio(s, num_agents)),
            wait_ratio=wait_ratio,
        )
        for s in SIZES
    }
    return EnvConfig(sizes=sizes, num_agents=num_agents)


def restrict_sizes(cfg: EnvConfig, max_size: int | None) -> tuple[EnvConfig, str | None]:
    """`cfg` with no data above `max_size` x `max_size`: those sizes' data ratios set to 0 and the rest
    renormalised (uniform over 3..max_size if nothing was left), hole and wait ratios kept. Returns the
    config and a one-line note of what moved (None when nothing did, or when `max_size` is None).

    A preset uses it to train only where its policy can be right (the cpu preset: 3x3-5x5, where the 135M
    policy is sometimes valid; at 6x6-10x10 every GRPO group scores 0 and teaches nothing).

    >>> cfg, note = restrict_sizes(uniform_config(), 4)
    >>> cfg.sizes[3].data_ratio, cfg.sizes[4].data_ratio, cfg.sizes[5].data_ratio, note
    (0.5, 0.5, 0.0, 'sizes 5-10 are not trained at this preset (max_train_size 4): their data share 75 % moved onto 3-4')
    """
    if max_size is None:
        return cfg, None
    if max_size not in SIZES:
        raise ValueError(f"max_train_size must be one of {SIZES[0]}..{SIZES[-1]} or None; got {max_size!r}")
    kept = [s for s in SIZES if s <= max_size]
    moved = sum(k.data_ratio for s, k in cfg.sizes.items() if s > max_size)
    if moved <= 0.0:  # max_size 10, or no data above it
        return cfg, None
    left = sum(cfg.sizes[s].data_ratio for s in kept)
    data = {s: 0.0 for s in SIZES}
    for s in kept:
        data[s] = cfg.sizes[s].data_ratio / left if left > 0 else 1.0 / len(kept)
    sizes = {s: cfg.sizes[s].model_copy(update={"data_ratio": data[s]}) for s in SIZES}
    span = f"{SIZES[0]}-{max_size}" if max_size > SIZES[0] else str(max_size)
    how = "moved onto" if left > 0 else "spread evenly over"
    dropped = f"size {SIZES[-1]} is" if max_size + 1 == SIZES[-1] else f"sizes {max_size + 1}-{SIZES[-1]} are"
    note = (
        f"{dropped} not trained at this preset (max_train_size {max_size}): "
        f"their data share {100 * moved:.0f} % {how} {span}"
    )
    return EnvConfig(sizes=sizes, num_agents=cfg.num_agents, num_instances=cfg.num_instances), note


def random_config(seed: int, num_agents: int = 2) -> EnvConfig:
    """The paper's stage-0 configuration: random knobs, reproducible from `seed`.

    Data ratios are a flat Dirichlet draw; hole ratios uniform in [0, max_hole_ratio(size)];
    wait ratios uniform in [0, 1]; all rounded to 3 decimals (data ratios still sum to 1).
    """
    rng = random.Random(f"random_config:{seed}")
    raw = [-math.log(1.0 - rng.random()) for _ in SIZES]
    total = sum(raw)
    data = [round(x / total, 3) for x in raw]
    data[-1] = round(1.0 - sum(data[:-1]), 6)
    if data[-1] < 0:  # rounding pushed the remainder below 0: move it onto the largest share
        i = max(range(len(data) - 1), key=data.__getitem__)
        data[i] = round(data[i] + data[-1], 6)
        data[-1] = 0.0
    sizes = {}
    for s, d in zip(SIZES, data, strict=True):
        cap = max_hole_ratio(s, num_agents)
        sizes[s] = SizeKnobs(
            data_ratio=d, hole_ratio=round(rng.uniform(0.0, cap), 3), wait_ratio=round(rng.random(), 3)
        )
    return EnvConfig(sizes=sizes, num_agents=num_agents)


def _digits(v: int) -> int:
    """About how many decimal digits `v` has (without str(), which refuses ints past 4300 digits)."""
    return int(abs(v).bit_length() * math.log10(2)) + 1


def _shown(v: Any, limit: int = 60) -> str:
    """`repr(v)` cut to `limit` characters (a 400-digit integer or a long string stays readable)."""
    try:
        text = repr(v)
    except ValueError:  # an int past Python's digit limit for str()
        text = f"<an integer of about {_digits(v)} digits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_float(v: Any, where: str, notes: list[str], default: float) -> float:
    if isinstance(v, bool) or v is None:
        notes.append(f"{where}: {v!r} is not a number; used {default}")
        return default
    if isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            notes.append(f"{where}: {_shown(v)} is not a number; used {default}")
            return default
        notes.append(f"{where}: read the string {_shown(v)} as the number {x:g}")
        v = x
    if not isinstance(v, int | float):
        notes.append(f"{where}: {_shown(v)} is not a number; used {default}")
        return default
    try:
        v = float(v)
    except OverflowError:  # an integer too large for a float (JSON allows any number of digits)
        c = 1.0 if v > 0 else 0.0
        notes.append(f"{where}: clipped an integer of about {_digits(v)} digits to {c:g}")
        return c
    if not math.isfinite(v):
        notes.append(f"{where}: {v} is not finite; used {default}")
        return default
    if v < 0.0 or v > 1.0:
        c = min(1.0, max(0.0, v))
        notes.append(f"{where}: clipped {v:g} to {c:g}")
        return c
    return v


def project(raw: Any) -> tuple[EnvConfig, list[str]]:
    """Project a proposal onto the legal space (the paper's projection) and say what changed.

    Steps, each recorded as a note: read a numeric string as its number and clip every knob to [0, 1] (an
    integer too large for a float included); renormalise the data ratios to sum to 1
    (uniform if all are zero); cap each hole ratio at `max_hole_ratio(size, num_agents)`; fill a missing
    size or knob from `uniform_config()`; drop unknown sizes and keys. `num_agents` and `num_instances`
    are kept when present and valid. Raises `ValueError` only when `raw` is not a mapping with a
    `sizes` mapping.

    >>> cfg, notes = project({"sizes": {str(s): {"data_ratio": 2, "hole_ratio": 0.1, "wait_ratio": 0.5}
    ...                                 for s in range(3, 11)}})
    >>> cfg.sizes[3].data_ratio, notes[0]
    (0.125, 'sizes.3.data_ratio: clipped 2 to 1')
    """
    if not isinstance(raw, dict):
        raise ValueError(f"config must be a JSON object with a 'sizes' object, got {type(raw).__name__}")
    sizes_raw = raw.get("sizes")
    if not isinstance(sizes_raw, dict):
        raise ValueError("config must have a 'sizes' object mapping each size 3..10 to its knobs")
    notes: list[str] = []
    base = EnvConfig.model_fields
    num_agents = raw.get("num_agents", base["num_agents"].default)
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or not 1 <= num_agents <= MAX_AGENTS:
        notes.append(f"num_agents: {num_agents!r} is not an integer in 1..{MAX_AGENTS}; used 2")
        num_agents = 2
    num_instances = raw.get("num_instances", DEFAULT_NUM_INSTANCES)
    if isinstance(num_instances, bool) or not isinstance(num_instances, int) or not 1 <= num_instances <= 1_000_000:
        notes.append(f"num_instances: {num_instances!r} is not an integer in 1..1000000; used {DEFAULT_NUM_INSTANCES}")
        num_instances = DEFAULT_NUM_INSTANCES
    for key in raw:
        if key not in ("sizes", "num_agents", "num_instances"):
            notes.append(f"{key}: unknown key dropped")

    by_size: dict[int, Any] = {}
    for key, knobs in sizes_raw.items():
        try:
            s = int(key)
        except (TypeError, ValueError):
            s = None
        if s not in SIZES or (isinstance(key, str) and key.strip() != str(s)):
            notes.append(f"sizes.{key}: unknown size dropped (sizes are 3..10)")
            continue
        by_size[s] = knobs

    default = uniform_config(num_agents=num_agents)
    data, holes, waits = {}, {}, {}
    for s in SIZES:
        d = default.sizes[s]
        knobs = by_size.get(s)
        if knobs is None:
            notes.append(f"sizes.{s}: missing; used data_ratio 0, hole_ratio {d.hole_ratio}, wait_ratio {d.wait_ratio}")
            knobs = {"data_ratio": 0.0, "hole_ratio": d.hole_ratio, "wait_ratio": d.wait_ratio}
        if not isinstance(knobs, dict):
            raise ValueError(f"sizes.{s} must be an object with data_ratio, hole_ratio, wait_ratio")
        for k in knobs:
            if k not in ("data_ratio", "hole_ratio", "wait_ratio"):
                notes.append(f"sizes.{s}.{k}: unknown knob dropped")
        vals = {}
        for name in ("data_ratio", "hole_ratio", "wait_ratio"):
            if name not in knobs:
                fill = 0.0 if name == "data_ratio" else getattr(d, name)
                notes.append(f"sizes.{s}.{name}: missing; used {fill}")
                vals[name] = fill
            else:
                vals[name] = _as_float(knobs[name], f"sizes.{s}.{name}", notes, getattr(d, name))
        data[s], holes[s], waits[s] = vals["data_ratio"], vals["hole_ratio"], vals["wait_ratio"]

    total = sum(data.values())
    if total <= 0.0:
        notes.append("data ratios are all zero; used uniform 1/8 for every size")
        data = {s: 1.0 / len(SIZES) for s in SIZES}
    elif abs(total - 1.0) > _RATIO_SUM_TOL:
        notes.append(f"data ratios summed to {total:.10g}; renormalised to 1")
        data = {s: v / total for s, v in data.items()}
    for s in SIZES:
        cap = max_hole_ratio(s, num_agents)
        if holes[s] > cap:
            notes.append(f"sizes.{s}.hole_ratio: capped {holes[s]:g} at {cap:g}, the most a {s}x{s} map serves")
            holes[s] = cap
    cfg = EnvConfig(
        sizes={s: SizeKnobs(data_ratio=data[s], hole_ratio=holes[s], wait_ratio=waits[s]) for s in SIZES},
        num_agents=num_agents,
        num_instances=num_instances,
    )
    return cfg, notes


def format_validation_error(err: Exception) -> str:
    """One line for a pydantic `ValidationError` (field path, message, offending value) or any error."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        parts = []
        for e in errors():
            loc = ".".join(str(x) for x in e.get("loc", ())) or "config"
            msg = e.get("msg", "invalid").removeprefix("Value error, ")
            inp = e.get("input")
            shown = "" if isinstance(inp, dict | list) or inp is None else f" (got {_shown(inp, 120)})"
            parts.append(f"{loc}: {msg}{shown}")
        return "; ".join(parts)
    return str(err)
