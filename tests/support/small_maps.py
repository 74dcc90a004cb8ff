"""Small generated instance sets for tests that train or sample on the embedded policy."""

from __future__ import annotations

from env import SIZES, EnvConfig, generate


def three_by_three(n: int, seed: int) -> list:
    """`n` fresh 3x3 instances (holes 0.1, waits 0.3) from `seed`: maps the 135M policy sometimes solves."""
    cfg = EnvConfig.model_validate(
        {"sizes": {s: {"data_ratio": float(s == 3), "hole_ratio": 0.1, "wait_ratio": 0.3} for s in SIZES}})
    return generate(cfg, n, seed=seed).instances
