"""Classic (non-LLM) environment engineers: the curricula an LLM engineer is compared against.

Each engineer is a pure function

    engineer(config, by_level, memory, rng) -> (raw_config, rationale, memory)

- `config`: the current stage's EnvConfig as a dict (`model_dump()`; size keys may be int or str);
- `by_level`: the evaluation's per-level table (MAPF: per grid size) (`metrics["by_level"]`): `{size: {"n", "valid_rate",
  "optimal_rate", ...}}`; sizes the validation split does not cover are simply absent;
- `memory`: the engineer's own state carried between stages (`state["engineer_memory"]`), never mutated;
- `rng`: a `random.Random` the caller seeds from (settings.seed, stage).

`raw_config` is `{"sizes": {"3": {"data_ratio", "hole_ratio", "wait_ratio"}, ...}}`, exactly what an LLM
engineer is asked to answer, and it goes through the same validation (strict check, projection,
feasibility dry-run) so every comparison is like for like. The success rate `p` of a size is its valid
rate on the validation split.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from env import max_hole_ratio, random_config
from families.rlve_rule import rlve_step
from llm_backends.engineers import CLASSIC_ENGINEERS

KNOBS = ("data_ratio", "hole_ratio", "wait_ratio")

# learnability: a share of the data is spread uniformly so that no size is starved (p(1-p) = 0 at p = 0
# or 1, and a size that is never trained on cannot start to improve); hole/wait move by at most this much
# per stage, in proportion to how far p is from the 0.5 target.
LEARNABILITY_UNIFORM_MIX = 0.2
LEARNABILITY_STEP = 0.1
# threshold: a size whose success passes the bar gets this much more holes and waits, and hands this
# fraction of its data share on to the next larger size.
THRESHOLD_BAR = 0.7
THRESHOLD_STEP = 0.1
THRESHOLD_SHIFT = 0.5

Engineer = Callable[
    [Mapping[str, Any], Mapping[Any, Mapping[str, Any]], Mapping[str, Any], random.Random],
    tuple[dict[str, Any], str, dict[str, Any]],
]


def sizes_of(config: Mapping[str, Any]) -> dict[int, dict[str, float]]:
    """`{size: {knob: value}}` with int keys, from an EnvConfig dump (int or str keys)."""
    out: dict[int, dict[str, float]] = {}
    for key, knobs in (config.get("sizes") or {}).items():
        out[int(key)] = {k: float(knobs[k]) for k in KNOBS}
    return out


def as_raw(sizes: Mapping[int, Mapping[str, float]]) -> dict[str, Any]:
    """The engineer answer shape: `{"sizes": {"3": {...}, ...}}` with floats rounded to 6 decimals.

    Data ratios that summed to 1 still do after rounding (the rounding error goes to the largest share), so a
    classic engineer's answer passes strict validation as written instead of being "projected" for a
    millionth (8 shares rounded to 6 decimals can miss 1 by up to 4e-6, beyond the 1e-6 tolerance).
    """
    out = {str(s): {k: round(float(sizes[s][k]), 6) for k in KNOBS} for s in sorted(sizes)}
    if out and abs(sum(float(v["data_ratio"]) for v in sizes.values()) - 1.0) <= 1e-3:
        big = max(out, key=lambda k: out[k]["data_ratio"])
        out[big]["data_ratio"] = round(1.0 - sum(v["data_ratio"] for k, v in out.items() if k != big), 6)
    return {"sizes": out}


def success_rates(by_level: Mapping[Any, Mapping[str, Any]]) -> dict[int, float]:
    """`{size: valid_rate}` for the sizes the evaluation covered (n > 0)."""
    out: dict[int, float] = {}
    for key, row in (by_level or {}).items():
        if row.get("n", 0) and row.get("valid_rate") is not None:
            out[int(key)] = float(row["valid_rate"])
    return out


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def _hole(config: Mapping[str, Any], size: int, x: float) -> float:
    """A hole ratio clipped to [0, the most a size-x-size map with the config's agents serves]."""
    return min(max_hole_ratio(size, int(config.get("num_agents") or 2)), max(0.0, x))


def fixed(config, by_level, memory, rng):
    """The paper's baseline: the first config it is shown (stage 0's random config) forever."""
    memory = dict(memory or {})
    memory.setdefault("fixed_config", as_raw(sizes_of(config)))
    return memory["fixed_config"], "fixed: keep the stage-0 configuration", memory


def random_engineer(config, by_level, memory, rng):
    """Domain randomisation: a fresh random config every stage (seeded by the caller's rng)."""
    seed = rng.randrange(2**31)
    raw = as_raw(sizes_of(random_config(seed).model_dump()))
    return raw, f"random: fresh random configuration (seed {seed})", dict(memory or {})


def learnability(config, by_level, memory, rng):
    """Data toward sizes whose success p is near 0.5, in proportion to p(1-p); hole and wait nudged toward
    that target (harder where p > 0.5, easier where p < 0.5). Sizes the evaluation does not cover get the
    mean learnability of the covered ones and keep their hole/wait."""
    cur = sizes_of(config)
    p = success_rates(by_level)
    score = {s: p[s] * (1 - p[s]) for s in p}
    prior = sum(score.values()) / len(score) if score else 0.25
    raw_scores = {s: score.get(s, prior) for s in cur}
    total = sum(raw_scores.values())
    n = len(cur)
    new: dict[int, dict[str, float]] = {}
    for s in cur:
        share = raw_scores[s] / total if total > 0 else 1.0 / n
        data = (1 - LEARNABILITY_UNIFORM_MIX) * share + LEARNABILITY_UNIFORM_MIX / n
        knobs = dict(cur[s], data_ratio=data)
        if s in p:
            delta = LEARNABILITY_STEP * 2 * (p[s] - 0.5)  # in [-step, +step]
            knobs["hole_ratio"] = _hole(config, s, cur[s]["hole_ratio"] + delta)
            knobs["wait_ratio"] = _clip(cur[s]["wait_ratio"] + delta)
        new[s] = knobs
    if total <= 0:
        why = "no size has 0 < p < 1, so data is spread uniformly"
    else:
        best = max(p, key=lambda s: score[s]) if p else None
        why = f"most data to size {best} (p={p[best]:.2f})" if best is not None else "no evaluated size"
    return as_raw(new), f"learnability p(1-p): {why}; hole/wait moved toward p=0.5", dict(memory or {})


def threshold(config, by_level, memory, rng):
    """Raise a size's difficulty once its success passes the bar: +step hole and wait ratio, and a share of
    its data handed to the next larger size. Sizes below the bar are left as they are."""
    cur = sizes_of(config)
    p = success_rates(by_level)
    memory = dict(memory or {})
    levels = {int(k): int(v) for k, v in (memory.get("levels") or {}).items()}
    new = {s: dict(k) for s, k in cur.items()}
    raised = []
    for s in sorted(cur):
        if p.get(s, -1.0) < THRESHOLD_BAR:
            continue
        raised.append(s)
        levels[s] = levels.get(s, 0) + 1
        new[s]["hole_ratio"] = _hole(config, s, cur[s]["hole_ratio"] + THRESHOLD_STEP)
        new[s]["wait_ratio"] = _clip(cur[s]["wait_ratio"] + THRESHOLD_STEP)
        larger = [t for t in sorted(cur) if t > s]
        if larger:
            moved = new[s]["data_ratio"] * THRESHOLD_SHIFT
            new[s]["data_ratio"] -= moved
            new[larger[0]]["data_ratio"] += moved
    memory["levels"] = {str(s): v for s, v in sorted(levels.items())}
    why = (
        f"sizes {raised} passed p>={THRESHOLD_BAR}: harder and data moved up"
        if raised
        else (f"no size passed p>={THRESHOLD_BAR}: unchanged")
    )
    return as_raw(new), f"threshold: {why}", memory


def rlve(config, by_level, memory, rng):
    """RLVE's rule (families/rlve_rule.py) over the grid sizes, smallest first: the data in equal shares over the
    last 4 sizes reached, each size's hole and wait ratios as they are."""
    cur = sizes_of(config)
    window, why, memory = rlve_step(sorted(cur), by_level, memory)
    return as_raw({s: {**k, "data_ratio": 1 / len(window) if s in window else 0.0} for s, k in cur.items()}), why, memory


# name -> engineer, the names in llm_backends.engineers.CLASSIC_ENGINEERS' order (their one home)
CLASSIC: dict[str, Engineer] = dict(
    zip(CLASSIC_ENGINEERS, (fixed, random_engineer, learnability, threshold, rlve), strict=True)
)

__all__ = [
    "CLASSIC",
    "KNOBS",
    "as_raw",
    "fixed",
    "learnability",
    "random_engineer",
    "rlve",
    "sizes_of",
    "success_rates",
    "threshold",
]
