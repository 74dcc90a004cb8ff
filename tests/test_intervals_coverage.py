"""The two-way bootstrap covers the true mean of a crossed design (seeds x shared instances); the within-seed
bootstrap it replaced does not.

Every seed of an arm answers the same instances, so instance noise is shared by all seeds. The simulation
draws a known design, value = mean + seed effect + instance effect + noise, with the instance part
dominating (as on 150 validation instances), and counts how often each method's 95 % interval holds the
true mean. numpy only, a few seconds.
"""

from __future__ import annotations

import numpy as np

from evals.intervals import _percentiles, crossed_interval, resample_weights, seed_mean

TRUE_MEAN = 0.5
SEEDS, INSTANCES, REPLICATES, DRAWS = 5, 100, 400, 1000
SD_SEED, SD_INSTANCE, SD_NOISE = 0.015, 0.3, 0.1  # instance part dominates: se 0.030 of 0.031


def within_seed_interval(y: np.ndarray, rng: np.random.Generator, draws: int = DRAWS) -> tuple[float, float]:
    """The replaced method, kept here only as the reference: seeds drawn with replacement, then each seed's
    instances drawn anew on their own, as if no two seeds shared an instance."""
    per_seed = np.stack([resample_weights(rng, y.shape[1], draws) @ y[s] for s in range(y.shape[0])], axis=1)
    return _percentiles(seed_mean(per_seed, rng))


def simulate(rng: np.random.Generator) -> np.ndarray:
    seed = rng.normal(0, SD_SEED, SEEDS)[:, None]
    instance = rng.normal(0, SD_INSTANCE, INSTANCES)[None, :]
    return TRUE_MEAN + seed + instance + rng.normal(0, SD_NOISE, (SEEDS, INSTANCES))


def test_two_way_bootstrap_covers_a_crossed_design_and_the_within_seed_one_does_not():
    rng = np.random.default_rng(7)
    new = old = 0
    for r in range(REPLICATES):
        y = simulate(rng)
        lo, hi = crossed_interval(y, draws=DRAWS, seed=r)
        new += lo <= TRUE_MEAN <= hi
        lo, hi = within_seed_interval(y, np.random.default_rng(10_000 + r))
        old += lo <= TRUE_MEAN <= hi
    assert 0.92 <= new / REPLICATES <= 0.98, f"two-way bootstrap covered {new} of {REPLICATES}"
    assert old / REPLICATES < 0.85, f"the within-seed bootstrap covered {old} of {REPLICATES}"


def test_more_seeds_do_not_shrink_the_interval_below_the_instance_noise():
    """With the instance part fixed, 4x the seeds leave the width near the instances' own: the interval does not
    promise what only more instances can give."""
    rng = np.random.default_rng(3)
    instance = rng.normal(0, SD_INSTANCE, INSTANCES)
    widths = {}
    for seeds in (4, 16):
        y = TRUE_MEAN + instance[None, :] + rng.normal(0, SD_NOISE, (seeds, INSTANCES))
        lo, hi = crossed_interval(y, draws=DRAWS)
        widths[seeds] = hi - lo
    floor = 2 * 1.96 * instance.std() / np.sqrt(INSTANCES)
    assert widths[16] > 0.8 * floor and widths[16] > 0.7 * widths[4]
