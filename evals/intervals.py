"""95% intervals of rates that stay inside [0, 1] (gaps inside [-1, 1]): the percentile bootstrap over seeds
and instances, the Wilson score interval for one seed.

Why not Student-t over seeds: with 3 seeds, t_{0.975,2} = 4.30 turns a spread of rates near 0 into
intervals such as "10.2 ± 26.1", whose lower end is a negative success rate. A rate is a share of answers;
its interval must stay a share.

- A rate of one arm (`rate_interval`) is the mean over seeds of a per-seed statistic, and that statistic is
  the unweighted mean over strata (sizes, for the paper's "Sum"; a single stratum for a pooled rate) of the
  share of 1s among the stratum's instances. The bootstrap resamples seeds with replacement and, within each
  drawn seed, the instances of each stratum with replacement (a binomial draw: resampling n answers of which
  k succeeded is Binomial(n, k/n)), `DRAWS` times, and takes the 2.5th and 97.5th percentiles.
  One seed with one stratum: the Wilson interval of k of n instead (exact enough and never degenerate).
  Every answer the same (0 of N or N of N over all seeds): a resampling interval collapses to a point that
  claims certainty it has not earned, so the Wilson interval of the pooled count is reported instead
  (0 of 108 answers: [0, 3.4] %).
- The gap of an arm to a baseline (`gap_interval`) is paired by seed: the same seeds are drawn for both arms.
  Within a seed and stratum where both arms answered the same instances (same ids), instances are drawn as
  pairs (a multinomial draw over the four (arm, baseline) outcomes), so the gap measures what the arms did
  differently on the same questions; otherwise each arm's instances are drawn on their own.

The generator is seeded (`RNG_SEED`) per call, so a table rebuilt from the same verdicts is the same byte
for byte. `DRAWS` = 4000 draws cost a few milliseconds per cell (numpy).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

DRAWS = 4000
RNG_SEED = 20260617  # fixed: the same verdicts give the same intervals, byte for byte
LEVEL = 0.95

# A seed's data for one rate: strata -> (n, k), or for paired gaps strata -> outcome counts.
Strata = Mapping[Any, tuple[int, int]]


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (inside [0, 1] by construction)."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (0.0 if k == 0 else max(0.0, centre - half), 1.0 if k == n else min(1.0, centre + half))


def _percentiles(draws: np.ndarray) -> tuple[float, float]:
    a = (1 - LEVEL) / 2
    lo, hi = np.percentile(draws, [100 * a, 100 * (1 - a)])
    return float(lo), float(hi)


def _stat(seed_values: np.ndarray, seed_draws: np.ndarray) -> np.ndarray:
    """Mean over the drawn seeds: seed_values (DRAWS, n_seeds), seed_draws (DRAWS, n_seeds) of indices."""
    return np.take_along_axis(seed_values, seed_draws, axis=1).mean(axis=1)


def _empty(method: str | None = None) -> dict[str, Any]:
    return {"n": 0, "mean": None, "low": None, "high": None, "method": method}


def rate_interval(per_seed: Mapping[Any, Strata]) -> dict[str, Any]:
    """Mean over seeds of the per-seed mean over strata of k/n, with its 95% interval (see the module doc).

    `per_seed`: seed -> {stratum: (n, k)}; strata with n = 0 and seeds without any are left out. Returns
    {n (seeds), mean, low, high, method ('bootstrap' | 'wilson' | 'wilson-pooled'), per_seed}.
    """
    seeds = {s: {t: (n, k) for t, (n, k) in strata.items() if n} for s, strata in per_seed.items()}
    seeds = {s: st for s, st in seeds.items() if st}
    if not seeds:
        return {**_empty(), "per_seed": {}}
    values = {s: sum(k / n for n, k in st.values()) / len(st) for s, st in seeds.items()}
    mean = sum(values.values()) / len(values)
    out = {"n": len(seeds), "mean": mean, "per_seed": {str(s): v for s, v in sorted(values.items())}}
    n_all = sum(n for st in seeds.values() for n, _ in st.values())
    k_all = sum(k for st in seeds.values() for _, k in st.values())
    if k_all in (0, n_all) or (len(seeds) == 1 and len(next(iter(seeds.values()))) == 1):
        lo, hi = wilson(k_all, n_all)
        return {**out, "low": lo, "high": hi, "method": "wilson" if k_all not in (0, n_all) else "wilson-pooled"}
    rng = np.random.default_rng(RNG_SEED)
    cols = []
    for s in sorted(seeds):
        st = seeds[s]
        draws = [rng.binomial(n, k / n, size=DRAWS) / n for n, k in st.values()]
        cols.append(np.mean(draws, axis=0))
    seed_values = np.stack(cols, axis=1)
    pick = rng.integers(0, len(cols), size=(DRAWS, len(cols)))
    lo, hi = _percentiles(_stat(seed_values, pick))
    return {**out, "low": min(lo, mean), "high": max(hi, mean), "method": "bootstrap"}


def paired_outcomes(a: Sequence[tuple[str, bool]], b: Sequence[tuple[str, bool]]) -> tuple[int, int, int, int] | None:
    """(both, only a, only b, neither) counts when `a` and `b` (id, success) cover the same ids once each;
    None when they do not (the stratum is then resampled per arm)."""
    da, db = dict(a), dict(b)
    if len(da) != len(a) or len(db) != len(b) or set(da) != set(db):
        return None
    both = sum(1 for i in da if da[i] and db[i])
    only_a = sum(1 for i in da if da[i] and not db[i])
    only_b = sum(1 for i in da if db[i] and not da[i])
    return both, only_a, only_b, len(da) - both - only_a - only_b


def gap_interval(arm: Mapping[Any, Mapping[Any, Sequence[tuple[str, bool]]]],
                 base: Mapping[Any, Mapping[Any, Sequence[tuple[str, bool]]]]) -> dict[str, Any]:
    """Paired gap arm - baseline: mean over the seeds both have of (mean over common strata of the arm's
    rate minus the baseline's), with a 95% bootstrap interval inside [-1, 1] that draws the same seeds for
    both arms and, where both answered the same instances, the same instances (see the module doc).

    `arm`, `base`: seed -> {stratum: [(instance id, success), ...]}.
    """
    seeds = sorted(s for s in arm if s in base)
    per_seed: dict[Any, list[tuple[tuple[int, int, int, int] | None, tuple[int, int], tuple[int, int]]]] = {}
    for s in seeds:
        strata = [t for t in arm[s] if t in base[s] and arm[s][t] and base[s][t]]
        if strata:
            per_seed[s] = [(paired_outcomes(arm[s][t], base[s][t]),
                            (len(arm[s][t]), sum(bool(v) for _, v in arm[s][t])),
                            (len(base[s][t]), sum(bool(v) for _, v in base[s][t]))) for t in strata]
    if not per_seed:
        return {**_empty(), "per_seed": {}, "paired_instances": False}
    values = {s: sum(ka / na - kb / nb for _, (na, ka), (nb, kb) in st) / len(st) for s, st in per_seed.items()}
    mean = sum(values.values()) / len(values)
    paired = all(p is not None for st in per_seed.values() for p, _, _ in st)
    out = {"n": len(values), "mean": mean, "per_seed": {str(s): v for s, v in sorted(values.items())},
           "paired_instances": paired}
    rng = np.random.default_rng(RNG_SEED)
    cols = []
    for s in sorted(per_seed):
        draws = []
        for p, (na, ka), (nb, kb) in per_seed[s]:
            if p is not None:
                n, only_a, only_b = sum(p), p[1], p[2]
                # the (only a, only b) counts of a multinomial draw, as two binomials (numpy's vectorised
                # binomial is much faster than its multinomial with many draws)
                a = rng.binomial(n, only_a / n, size=DRAWS)
                rest = n - only_a
                b = rng.binomial(n - a, only_b / rest if rest else 0.0)
                draws.append((a - b) / n)
            else:
                draws.append(rng.binomial(na, ka / na, size=DRAWS) / na - rng.binomial(nb, kb / nb, size=DRAWS) / nb)
        cols.append(np.mean(draws, axis=0))
    seed_values = np.stack(cols, axis=1)
    pick = rng.integers(0, len(cols), size=(DRAWS, len(cols)))
    lo, hi = _percentiles(_stat(seed_values, pick))
    return {**out, "low": max(-1.0, min(lo, mean)), "high": min(1.0, max(hi, mean)), "method": "paired bootstrap"}


def paired_bootstrap(diffs: list[list[int]], n: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95 % interval of the mean gain of `evals.bench.bench_learning`: resample seeds, then instances within each
    seed, of the per-instance paired differences (-1, 0, +1) after minus before."""
    rng = random.Random(seed)
    means = []
    for _ in range(n):
        total = count = 0
        for d in (diffs[rng.randrange(len(diffs))] for _ in diffs):
            for _ in d:
                total += d[rng.randrange(len(d))]
                count += 1
        means.append(total / count)
    means.sort()
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def t_interval(values: list[float]) -> tuple[float, float]:
    """Student's t 95 % interval of the mean of `values` (nan for one value): printed by `bench_learning` beside
    `paired_bootstrap`, for gains (not rates, which the bootstrap above keeps inside [0, 1])."""
    from math import nan, sqrt

    t975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
    if len(values) < 2:
        return nan, nan
    m, sd = statistics.fmean(values), statistics.stdev(values)
    h = t975.get(len(values) - 1, 1.96) * sd / sqrt(len(values))
    return m - h, m + h
