"""Statistics of a grid's verdict files: rates per subset and seed, means with 95% t-intervals, paired gaps.

Per seed, the valid / optimal rate of a subset (3, 4 or 5 agents; wait ratio 0.25 / 0.50 / 0.75; all)
pools every instance of that subset over all sizes (the paper's "aggregate over sizes"). Over seeds we
report the mean and a two-sided 95% Student-t interval (mean +- t_{0.975, n-1} * sd / sqrt(n)), and the gap
to the baseline arm as the mean of the per-seed paired differences with its own t-interval. Next to them:
where the answers fail (the share of answers by first failing check, `failures.csv`), which separates arms
whose valid rates are all zero, and a note naming the arms of a seed whose final answers are identical
answer for answer (their stages changed nothing the benchmark sees).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.results import read_jsonl

METRICS = ("valid", "optimal")
# The paper's columns, always shown (an empty one as "–" with n=0, never dropped silently).
PAPER_SUBSETS = ("agents_3", "agents_4", "agents_5", "wait_0.25", "wait_0.50", "wait_0.75", "all")


# two-sided 95% Student-t quantiles t_{0.975, df}; df > 30 uses the Cornish-Fisher expansion below
_T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
         10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199, 17: 2.1098,
         18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639, 25: 2.0595,
         26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423}


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (exact table up to 30)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df in _T975:
        return _T975[df]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% t-interval half-width over seeds; half is None with fewer than 2 values.

    >>> r = mean_ci([0.2, 0.4, 0.6]); round(r["mean"], 3), round(r["half"], 3)
    (0.4, 0.497)
    """
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "half": None, "low": None, "high": None, "sd": None}
    m = statistics.fmean(vals)
    if n < 2:
        return {"n": 1, "mean": m, "half": None, "low": None, "high": None, "sd": None}
    sd = statistics.stdev(vals)
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "half": half, "low": m - half, "high": m + half, "sd": sd}


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (for one model on one split, no seeds)."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def subset_key_agents(row: dict) -> str:
    return f"agents_{int((row.get('tags') or {}).get('agents') or row.get('num_agents') or 2)}"


def subset_key_wait(row: dict) -> str | None:
    w = (row.get("tags") or {}).get("wait")
    return None if w is None else f"wait_{float(w):.2f}"


def subset_counts(rows: Iterable[dict]) -> dict[str, dict[str, int]]:
    """Per subset (`all`, `agents_<a>`, `wait_<w>`, `agents_<a>/wait_<w>`): n, valid, optimal counts,
    pooled over sizes. Plain counting on the verdict rows, so a reader can check it by hand."""
    out: dict[str, dict[str, int]] = {}

    def add(key: str, row: dict) -> None:
        c = out.setdefault(key, {"n": 0, "valid": 0, "optimal": 0})
        c["n"] += 1
        c["valid"] += bool(row.get("valid"))
        c["optimal"] += bool(row.get("valid")) and bool(row.get("optimal"))

    for row in rows:
        a, w = subset_key_agents(row), subset_key_wait(row)
        add("all", row)
        add(a, row)
        if w is not None:
            add(w, row)
            add(f"{a}/{w}", row)
    return out


def subset_order(keys: Iterable[str], paper: bool = False) -> list[str]:
    """Table order of subset keys; `paper` adds the paper's columns (PAPER_SUBSETS) even when empty."""
    keys = set(keys) | (set(PAPER_SUBSETS) if paper else set())
    agents = sorted((k for k in keys if k.startswith("agents_") and "/" not in k), key=lambda k: int(k[7:]))
    waits = sorted((k for k in keys if k.startswith("wait_")), key=lambda k: float(k[5:]))
    cross = sorted((k for k in keys if "/" in k), key=lambda k: (int(k.split("/")[0][7:]), float(k.split("/")[1][5:])))
    return agents + waits + cross + (["all"] if "all" in keys else [])


def summarize(verdicts: Mapping[tuple[str, int], Path], arm_order: Sequence[str], baseline: str | None) -> dict:
    """Per arm and subset: per-seed rates, mean and 95% t-interval, and the paired gap to `baseline`."""
    per_seed: dict[str, dict[int, dict[str, dict[str, int]]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        per_seed.setdefault(label, {})[seed] = subset_counts(read_jsonl(folder / "final" / "eval.jsonl"))
    arms = [a for a in arm_order if a in per_seed] + sorted(a for a in per_seed if a not in arm_order)
    subsets = subset_order((k for seeds in per_seed.values() for c in seeds.values() for k in c), paper=True)
    table: dict[str, Any] = {"arms": arms, "subsets": subsets, "baseline": baseline, "rows": {}}
    for label in arms:
        seeds = per_seed[label]
        row: dict[str, Any] = {"seeds": sorted(seeds)}
        for sub in subsets:
            cell: dict[str, Any] = {}
            for metric in METRICS:
                rates = {s: c[sub][metric] / c[sub]["n"] for s, c in seeds.items() if sub in c and c[sub]["n"]}
                stat = mean_ci(list(rates.values()))
                stat["per_seed"] = {str(s): r for s, r in sorted(rates.items())}
                stat["n_instances"] = {str(s): c[sub]["n"] for s, c in sorted(seeds.items()) if sub in c}
                if baseline and baseline in per_seed and label != baseline:
                    base = per_seed[baseline]
                    diffs = [r - base[s][sub][metric] / base[s][sub]["n"]
                             for s, r in sorted(rates.items()) if s in base and sub in base[s] and base[s][sub]["n"]]
                    stat["gap"] = mean_ci(diffs)
                cell[metric] = stat
            row[sub] = cell
        table["rows"][label] = row
    table["failures"] = failure_shares(verdicts, arms)
    return table


def failure_shares(verdicts: Mapping[tuple[str, int], Path], arm_order: Sequence[str]) -> dict:
    """Where the held-out answers fail: per arm, the share of final-benchmark answers by the first check they
    fail (`valid` when none; the checker's order, env.verify.CHECK_ORDER), as the mean and 95% t-interval
    over seeds. It separates arms whose valid rates are all zero (a policy that now writes every agent's
    path but collides differs from one that still drops agents)."""
    from env.verify import CHECK_ORDER

    per: dict[str, dict[int, dict[str, float]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        rows = read_jsonl(folder / "final" / "eval.jsonl")
        if rows:
            counts = Counter("valid" if r.get("valid") else (r.get("failure") or "unknown") for r in rows)
            per.setdefault(label, {})[seed] = {k: c / len(rows) for k, c in counts.items()}
    seen = {k for seeds in per.values() for shares in seeds.values() for k in shares}
    kinds = ["valid", *(k for k in CHECK_ORDER if k in seen), *sorted(seen - set(CHECK_ORDER) - {"valid"})]
    arms = [a for a in arm_order if a in per] + sorted(a for a in per if a not in arm_order)
    rows: dict[str, Any] = {}
    for a in arms:
        seeds = sorted(per[a])
        rows[a] = {"seeds": seeds}
        for k in kinds:
            stat = mean_ci([per[a][s].get(k, 0.0) for s in seeds])
            stat["per_seed"] = {str(s): per[a][s].get(k, 0.0) for s in seeds}
            rows[a][k] = stat
    return {"kinds": kinds, "arms": arms, "rows": rows}


def identical_answer_notes(verdicts: Mapping[tuple[str, int], Path]) -> list[str]:
    """Arms of one seed whose final benchmark answers are the same, answer for answer (id, text and verdict):
    the stages they designed changed nothing the benchmark sees, so their rows differ only by name."""
    groups: dict[int, dict[tuple[int, str], list[str]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        rows = read_jsonl(folder / "final" / "eval.jsonl")
        if not rows:
            continue
        key = json.dumps([[r.get(k) for k in ("id", "text", "valid", "optimal", "failure")] for r in rows])
        groups.setdefault(seed, {}).setdefault((len(rows), key), []).append(label)
    notes = []
    for seed, by_answers in sorted(groups.items()):
        for (n, _), labels in by_answers.items():
            if len(labels) > 1:
                notes.append(f"Identical answers, seed {seed}: {', '.join(labels)} gave the same {n} final benchmark "
                             "answers, text for text: the stages they designed changed nothing the benchmark sees, "
                             "so their rows differ only by name.")
    return notes
