"""95% intervals of rates that stay inside [0, 1] (gaps inside [-1, 1]): a two-way (crossed) percentile
bootstrap over seeds and instances, the Wilson score interval for one seed.

Why two-way: every seed of an arm answers the same instances (the same split, from the same start), so the
instances are a sample shared by all seeds, not a fresh one per seed. A bootstrap that draws instances anew
within each drawn seed treats that shared noise as if it averaged out over seeds, and its interval shrinks
with every seed added while the real uncertainty does not: 150 instances alone keep a gain's interval near
±5 points however many seeds run. Here each bootstrap replicate draws the seeds with replacement and, once,
the instances with replacement, and applies that one instance draw to every drawn seed (a crossed design,
seeds x instances). `tests/test_intervals_coverage.py` simulates such a design and checks the coverage.

Why not Student-t over seeds: with 3 seeds, t_{0.975,2} = 4.30 turns a spread of rates near 0 into
intervals such as "10.2 ± 26.1", whose lower end is a negative success rate. A rate is a share of answers;
its interval must stay a share.

- A rate of one arm (`rate_interval`) is the mean over seeds of a per-seed statistic, and that statistic is
  the unweighted mean over strata (sizes, for the paper's "Sum"; a single stratum for a pooled rate) of the
  share of 1s among the stratum's instances. Within a stratum, instances are matched across seeds by id:
  where every seed answered the same ids, one instance draw serves all seeds; where the seeds answered
  other instances (or only counts are known), each seed's instances are drawn on their own, since they
  share nothing. `DRAWS` replicates, the 2.5th and 97.5th percentiles.
  One seed with one stratum: the Wilson interval of k of n instead (exact enough and never degenerate).
  Every answer the same (0 of N or N of N over all seeds): a resampling interval collapses to a point that
  claims certainty it has not earned, so the Wilson interval of the count over the distinct instances is
  reported instead (0 of 36 instances, whatever the number of seeds: [0, 9.6] %).
- The gap of an arm to a baseline (`gap_interval`) is paired by seed and by instance: the same seeds and,
  where both arms answered the same ids, the same instances are drawn for both, so the gap measures what
  the arms did differently on the same questions; otherwise each arm's instances are drawn on their own.
- The gain of a training stage over its start (`crossed_interval`, for `evals.bench.bench_learning`): the
  per-instance differences after minus before, one row per seed over the same instances in the same order.

The generator is seeded (`RNG_SEED`) per call, and each replicate's weighted sum of values is added up in
one fixed order (`weighted_sums`: instance after instance, in blocks of `SUM_BLOCK` whose sums are added in
turn), never by a BLAS matrix product, whose rounding depends on the machine's kernel and thread count; so a
table rebuilt from the same verdicts is the same byte for byte on any machine. That order is the one of
OpenBLAS's threaded dgemm with its Haswell-class kernels, which built the committed tables. `DRAWS` = 4000
draws cost a few milliseconds per cell (numpy).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from families.metrics import wilson  # one seed's interval; the run report uses it too

DRAWS = 4000
RNG_SEED = 20260617  # fixed: the same verdicts give the same intervals, byte for byte
LEVEL = 0.95
METHOD = "two-way bootstrap"  # the `method` of an interval drawn over seeds and shared instances
SUM_BLOCK = 256  # terms summed in one run before a block's sum is added to the total (`weighted_sums`)

# One seed's answers in one stratum: [(instance id, value), ...], or (n, k) when only counts are known.
Cell = Sequence[tuple[str, float]] | tuple[int, int]


def _percentiles(draws: np.ndarray) -> tuple[float, float]:
    a = (1 - LEVEL) / 2
    lo, hi = np.percentile(draws, [100 * a, 100 * (1 - a)])
    return float(lo), float(hi)


class SeededDraws:
    """A generator seeded with `seed` for one interval, whose draws are remembered across intervals.

    A table asks for thousands of intervals, each from a fresh generator with the same seed, and most ask for
    the same sequence of bootstrap sizes (the same sizes, strata and seeds in every row and metric), so they
    draw the same counts. The counts of each sequence of draws so far are kept (least recently used first out,
    `CACHE_BYTES` in all) with the generator's state after them: a repeated sequence is looked up, not drawn
    again, and a new one continues the generator exactly where the sequence left it, so every interval is
    the one a fresh `np.random.default_rng(seed)` gives."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.key: tuple = (seed,)
        self.state: dict | None = None  # the generator's state after the draws of `key`; None: freshly seeded

    def counts(self, n: int, draws: int) -> np.ndarray:
        self.key = (*self.key, (n, draws))
        hit = _DRAWN.get(self.key)
        if hit is None:
            rng = np.random.default_rng(self.seed)
            if self.state is not None:
                rng.bit_generator.state = self.state
            counts = resample_counts(rng, n, draws).astype(np.min_scalar_type(n))
            hit = _DRAWN[self.key] = (counts, rng.bit_generator.state)
            global _drawn_bytes
            _drawn_bytes += counts.nbytes
            while _drawn_bytes > CACHE_BYTES and len(_DRAWN) > 1:
                _drawn_bytes -= _DRAWN.pop(next(iter(_DRAWN)))[0].nbytes
        else:
            _DRAWN.move_to_end(self.key)
        self.state = hit[1]
        return hit[0]


CACHE_BYTES = 256 * 2**20
_DRAWN: OrderedDict[tuple, tuple[np.ndarray, dict]] = OrderedDict()
_drawn_bytes = 0


def resample_counts(rng: np.random.Generator | SeededDraws, n: int, draws: int = DRAWS) -> np.ndarray:
    """(draws, n) integer counts of a bootstrap of n items: how often each item was drawn (rows sum to n)."""
    if isinstance(rng, SeededDraws):
        return rng.counts(n, draws)
    idx = rng.integers(0, n, size=(draws, n))
    idx += n * np.arange(draws)[:, None]
    return np.bincount(idx.ravel(), minlength=draws * n).reshape(draws, n)


def resample_weights(rng: np.random.Generator | SeededDraws, n: int, draws: int = DRAWS) -> np.ndarray:
    """(draws, n) weights of a bootstrap of n items: how often each item was drawn, divided by n (rows sum to 1)."""
    return resample_counts(rng, n, draws) / n


def _sum_blocks(k: int) -> list[tuple[int, int]]:
    """The blocks of `k` terms whose sums `weighted_sums` adds in turn: SUM_BLOCK at a time while at least twice
    that is left, then the rest in two halves (the larger first) if it exceeds SUM_BLOCK."""
    out, start = [], 0
    while start < k:
        size = k - start
        if size >= 2 * SUM_BLOCK:
            size = SUM_BLOCK
        elif size > SUM_BLOCK:
            size = (size + 1) // 2
        out.append((start, start + size))
        start += size
    return out


def weighted_sums(counts: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """(counts / n) @ values, each replicate's sum added in one fixed order, the same on every machine (module
    doc): counts (draws, k) from `resample_counts`; values (k,) or (k, columns), in practice 0, 1 or -1 (a
    success, or the difference of two), whose zeros add nothing and are skipped."""
    y = np.asarray(values, dtype=float)
    cols = y[:, None] if y.ndim == 1 else y
    out = np.empty((counts.shape[0], cols.shape[1]))
    for c in range(cols.shape[1]):
        total = np.zeros(counts.shape[0])
        for a, b in _sum_blocks(cols.shape[0]):
            keep = np.flatnonzero(cols[a:b, c]) + a
            if len(keep):
                total = total + np.cumsum((counts[:, keep] / n) * cols[keep, c], axis=1)[:, -1]
        out[:, c] = total
    return out[:, 0] if y.ndim == 1 else out


def _as_pairs(cell: Cell, seed: Any) -> list[tuple[str, float]]:
    """A cell as [(id, value)]; counts (n, k) become n instances of this seed alone (nothing says they are shared)."""
    if isinstance(cell, tuple) and len(cell) == 2 and all(isinstance(x, (int, np.integer)) for x in cell):
        n, k = cell
        return [(f"{seed}\x00{j}", float(j < k)) for j in range(n)]
    return [(str(i), float(v)) for i, v in cell]


def shared_ids(cells: Sequence[Sequence[tuple[str, float]]]) -> list[str] | None:
    """The ids every one of `cells` answered, once each and no others (sorted); None when they differ."""
    first = [i for i, _ in cells[0]]
    ref = sorted(first)
    if len(set(ref)) != len(ref):
        return None
    for c in cells[1:]:
        if len(c) != len(ref) or sorted(i for i, _ in c) != ref:
            return None
    return ref


def _matrix(cells: Sequence[Sequence[tuple[str, float]]], ids: Sequence[str]) -> np.ndarray:
    col = {i: j for j, i in enumerate(ids)}
    y = np.zeros((len(cells), len(ids)))
    for s, c in enumerate(cells):
        for i, v in c:
            y[s, col[i]] = v
    return y


def stratum_draws(cells: Sequence[Sequence[tuple[str, float]]], rng: np.random.Generator | SeededDraws,
                  draws: int = DRAWS) -> np.ndarray:
    """(draws, seeds) bootstrap replicates of each seed's mean value in one stratum: one instance draw shared by
    every seed where they answered the same ids, else each seed's own instances drawn on their own."""
    ids = shared_ids(cells)
    if ids is not None:
        return weighted_sums(resample_counts(rng, len(ids), draws), len(ids), _matrix(cells, ids).T)
    cols = [weighted_sums(resample_counts(rng, len(c), draws), len(c), np.array([v for _, v in c], dtype=float))
            for c in cells]
    return np.stack(cols, axis=1)


def seed_mean(per_seed_draws: np.ndarray, rng: np.random.Generator | SeededDraws) -> np.ndarray:
    """(draws,) the mean over a bootstrap draw of seeds (with replacement) of (draws, seeds) replicates."""
    return (resample_weights(rng, per_seed_draws.shape[1], per_seed_draws.shape[0]) * per_seed_draws).sum(axis=1)


def _strata_mean_draws(per_seed: Mapping[Any, Mapping[Any, Sequence[tuple[str, float]]]], seeds: Sequence[Any],
                       rng: SeededDraws) -> np.ndarray:
    """(draws, seeds) replicates of each seed's unweighted mean over its strata."""
    total = np.zeros((DRAWS, len(seeds)))
    count = np.zeros(len(seeds))
    strata = sorted({t for s in seeds for t in per_seed[s]}, key=str)
    for t in strata:
        have = [j for j, s in enumerate(seeds) if t in per_seed[s]]
        total[:, have] += stratum_draws([per_seed[seeds[j]][t] for j in have], rng)
        count[have] += 1
    return total / count


def crossed_interval(rows: Sequence[Sequence[float]], draws: int = DRAWS, seed: int = RNG_SEED) -> tuple[float, float]:
    """95% two-way bootstrap interval of the mean of `rows` (one row per seed, the same instances in the same
    order in every row): each replicate draws seeds and, once for all of them, instances. For the gain of a
    training stage, rows of per-instance differences (-1, 0, +1) after minus before."""
    y = np.asarray(rows, dtype=float)
    if y.ndim != 2 or y.size == 0:
        raise ValueError(f"rows: need one equally long row of values per seed, got shape {y.shape}")
    rng = np.random.default_rng(seed)
    per_seed = resample_weights(rng, y.shape[1], draws) @ y.T
    return _percentiles(seed_mean(per_seed, rng))


def _empty(method: str | None = None) -> dict[str, Any]:
    return {"n": 0, "mean": None, "low": None, "high": None, "method": method}


def rate_interval(per_seed: Mapping[Any, Mapping[Any, Cell]]) -> dict[str, Any]:
    """Mean over seeds of the per-seed mean over strata of the share of successes, with its 95% interval (see
    the module doc).

    `per_seed`: seed -> {stratum: [(instance id, success), ...] or (n, k)}; empty strata and seeds without any
    are left out. Returns {n (seeds), mean, low, high, method ('two-way bootstrap' | 'wilson' |
    'wilson-pooled'), per_seed}.
    """
    seeds_data = {s: {t: _as_pairs(c, s) for t, c in strata.items()} for s, strata in per_seed.items()}
    seeds_data = {s: {t: c for t, c in st.items() if c} for s, st in seeds_data.items()}
    seeds_data = {s: st for s, st in seeds_data.items() if st}
    if not seeds_data:
        return {**_empty(), "per_seed": {}}
    values = {s: sum(sum(v for _, v in c) / len(c) for c in st.values()) / len(st) for s, st in seeds_data.items()}
    mean = sum(values.values()) / len(values)
    out = {"n": len(seeds_data), "mean": mean, "per_seed": {str(s): v for s, v in sorted(values.items())}}
    distinct = {(str(t), i): v for st in seeds_data.values() for t, c in st.items() for i, v in c}
    every = [v for st in seeds_data.values() for c in st.values() for _, v in c]
    binary = all(v in (0.0, 1.0) for v in every)  # else shares of right samples (mean@k): always the bootstrap
    if binary and all(v == every[0] for v in every):  # 0 of N or N of N: Wilson over the distinct instances
        lo, hi = wilson(int(sum(distinct.values())), len(distinct))
        return {**out, "low": lo, "high": hi, "method": "wilson-pooled"}
    if binary and len(seeds_data) == 1 and len(next(iter(seeds_data.values()))) == 1:
        c = next(iter(next(iter(seeds_data.values())).values()))
        lo, hi = wilson(int(sum(v for _, v in c)), len(c))
        return {**out, "low": lo, "high": hi, "method": "wilson"}
    rng = SeededDraws(RNG_SEED)
    seeds = sorted(seeds_data)
    lo, hi = _percentiles(seed_mean(_strata_mean_draws(seeds_data, seeds, rng), rng))
    return {**out, "low": min(lo, mean), "high": max(hi, mean), "method": METHOD}


def paired_cells(a: Sequence[tuple[str, bool]], b: Sequence[tuple[str, bool]]) -> list[tuple[str, float]] | None:
    """[(id, a's success - b's)] when `a` and `b` (id, success) cover the same ids once each; None when they do
    not (the stratum is then resampled per arm)."""
    da, db = dict(a), dict(b)
    if len(da) != len(a) or len(db) != len(b) or set(da) != set(db):
        return None
    return [(str(i), float(da[i]) - float(db[i])) for i in da]  # a success, or a share of right samples


def gap_interval(arm: Mapping[Any, Mapping[Any, Sequence[tuple[str, bool]]]],
                 base: Mapping[Any, Mapping[Any, Sequence[tuple[str, bool]]]]) -> dict[str, Any]:
    """Paired gap arm - baseline: mean over the seeds both have of (mean over common strata of the arm's
    rate minus the baseline's), with a 95% two-way bootstrap interval inside [-1, 1] that draws the same seeds
    for both arms and, where both answered the same instances, the same instances (see the module doc).

    `arm`, `base`: seed -> {stratum: [(instance id, success), ...]}.
    """
    seeds = sorted(s for s in arm if s in base)
    per_seed: dict[Any, dict[Any, tuple[list | None, list, list]]] = {}
    for s in seeds:
        strata = [t for t in arm[s] if t in base[s] and arm[s][t] and base[s][t]]
        if strata:
            per_seed[s] = {t: (paired_cells(arm[s][t], base[s][t]), _as_pairs(arm[s][t], s), _as_pairs(base[s][t], s))
                           for t in strata}
    if not per_seed:
        return {**_empty(), "per_seed": {}, "paired_instances": False}

    def rate(c: list) -> float:
        return sum(v for _, v in c) / len(c)

    values = {s: sum(rate(ca) - rate(cb) for _, ca, cb in st.values()) / len(st) for s, st in per_seed.items()}
    mean = sum(values.values()) / len(values)
    paired = all(p is not None for st in per_seed.values() for p, _, _ in st.values())
    out = {"n": len(values), "mean": mean, "per_seed": {str(s): v for s, v in sorted(values.items())},
           "paired_instances": paired}
    rng = SeededDraws(RNG_SEED)
    order = sorted(per_seed)
    total = np.zeros((DRAWS, len(order)))
    count = np.zeros(len(order))
    for t in sorted({t for st in per_seed.values() for t in st}, key=str):
        have = [j for j, s in enumerate(order) if t in per_seed[s]]
        cells = [per_seed[order[j]][t] for j in have]
        if all(p is not None for p, _, _ in cells):
            total[:, have] += stratum_draws([p for p, _, _ in cells], rng)
        else:
            total[:, have] += stratum_draws([a for _, a, _ in cells], rng) - stratum_draws([b for _, _, b in cells], rng)
        count[have] += 1
    lo, hi = _percentiles(seed_mean(total / count, rng))
    return {**out, "low": max(-1.0, min(lo, mean)), "high": min(1.0, max(hi, mean)), "method": f"paired {METHOD}"}


def t_interval(values: list[float]) -> tuple[float, float]:
    """Student's t 95 % interval of the mean of `values` (nan for one value): printed by `bench_learning` beside
    `crossed_interval`, for gains (not rates, which the bootstrap above keeps inside [0, 1])."""
    from math import nan, sqrt

    t975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
    if len(values) < 2:
        return nan, nan
    m, sd = statistics.fmean(values), statistics.stdev(values)
    h = t975.get(len(values) - 1, 1.96) * sd / sqrt(len(values))
    return m - h, m + h
