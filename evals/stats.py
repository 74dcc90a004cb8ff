"""Statistics of a grid's verdict files: rates per subset, size and seed, means with 95% intervals inside
[0, 100] %, paired gaps, failure shares.

Two layouts of the same verdict rows:
- per size (the paper's): for each agent count, the valid / optimal rate of each size, and "Sum", the
  unweighted mean of the per-size rates (3-agent valid = mean of 8 per-size rates), per seed first, then
  the mean over seeds;
- pooled: per subset (3, 4 or 5 agents; wait ratio 0.25 / 0.50 / 0.75; all), every instance of the subset
  over all sizes in one rate.
Intervals are `evals.intervals`' (a two-way bootstrap: seeds drawn with replacement and the instances they
share drawn once for all of them; Wilson for one seed); the gap to the baseline arm is paired by seed (and by
instance where both arms answered the same ones). What
"optimal" means is a parameter, the criterion (`is_optimal`), named in every table. Next to them: where the
answers fail (the share of answers by first failing check), which separates arms whose valid rates are all
zero, and a note naming the arms of a seed whose final answers are identical answer for answer.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.intervals import gap_interval, rate_interval, wilson  # noqa: F401 - wilson: for evals.bench
from evals.results import read_json, read_jsonl
from families.metrics import row_level

METRICS = ("valid", "optimal")
# The paper's columns, always shown (an empty one as "–" with n=0, never dropped silently).
PAPER_SUBSETS = ("agents_3", "agents_4", "agents_5", "wait_0.25", "wait_0.50", "wait_0.75", "all")
# What `optimal` means in a table (`is_optimal`); the paper's optimal rate is most likely makespan-optimal.
CRITERIA = ("soc", "makespan")
CRITERION_NAMES = {"soc": "sum of costs", "makespan": "makespan"}
INTERVAL_NOTE = ("95% two-way percentile bootstrap over seeds and instances (each draw takes seeds with "
                 "replacement and, once for all of them, the instances of each size that the seeds share; fixed "
                 "generator seed); Wilson score interval with one seed and one cell, and for a rate of 0 or 100% "
                 "over the distinct instances")


# Student-t: for evals.bench's paired per-instance differences (many instances), never for rates over seeds.
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
    """Mean and 95% t-interval half-width; half is None with fewer than 2 values. For evals.bench's paired
    per-instance differences (values in [-1, 1], many of them); never for rates over a few seeds, whose
    t-interval leaves [0, 1] (the tables use `evals.intervals`).

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


def subset_key_agents(row: dict) -> str:
    return f"agents_{int((row.get('tags') or {}).get('agents') or row.get('num_agents') or 2)}"


def _has_level(row: dict) -> bool:
    return row.get("level", row.get("size")) is not None


def subset_key_wait(row: dict) -> str | None:
    w = (row.get("tags") or {}).get("wait")
    return None if w is None else f"wait_{float(w):.2f}"


def subset_counts(rows: Iterable[dict], criterion: str = "soc") -> dict[str, dict[str, int]]:
    """Per subset (`all`, `agents_<a>`, `wait_<w>`, `agents_<a>/wait_<w>`): n, valid, optimal counts (optimal
    under `criterion`, `is_optimal`), pooled over sizes. Plain counting, so a reader can check it by hand."""
    out: dict[str, dict[str, int]] = {}

    def add(key: str, row: dict) -> None:
        c = out.setdefault(key, {"n": 0, "valid": 0, "optimal": 0})
        c["n"] += 1
        c["valid"] += bool(row.get("valid"))
        c["optimal"] += is_optimal(row, criterion)

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


def default_criterion(rows: Iterable[dict]) -> str:
    """`makespan` when every row carries the plan's and the instance's makespan, else `soc` (older verdict
    files know only sums of costs, so they can be tabulated under `soc` alone)."""
    rows = list(rows)
    ok = bool(rows) and all("makespan" in r and r.get("optimal_makespan") is not None for r in rows)
    return "makespan" if ok else "soc"


def is_optimal(row: Mapping[str, Any], criterion: str) -> bool:
    """Whether a verdict row's answer is optimal under `criterion`: `soc` (valid and its sum of costs equals
    the instance's optimal sum of costs, `optimal_soc`, else `optimal_cost`) or `makespan` (valid and its
    makespan equals the instance's optimal makespan). A row without any cost field (hand-made) falls back on
    its own `optimal` flag when that flag is a sum-of-costs verdict. Raises ValueError for a row that cannot
    be judged under `criterion` (never a silent mislabel)."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion {criterion!r}: allowed: {', '.join(CRITERIA)}")
    if criterion == "makespan":
        if "makespan" not in row or row.get("optimal_makespan") is None:
            raise ValueError(f"row {row.get('id')!r} has no makespan fields: tabulate it under 'soc'")
        return bool(row.get("valid")) and row["makespan"] is not None and row["makespan"] == row["optimal_makespan"]
    best = row.get("optimal_soc", row.get("optimal_cost"))
    if best is None and "cost" not in row:
        if row.get("criterion", "soc") != "soc":
            raise ValueError(f"row {row.get('id')!r}: its `optimal` flag is a {row['criterion']} verdict")
        return bool(row.get("valid")) and bool(row.get("optimal"))
    return bool(row.get("valid")) and row.get("cost") is not None and row["cost"] == best


def _success(row: Mapping[str, Any], metric: str, criterion: str) -> bool:
    return bool(row.get("valid")) if metric == "valid" else is_optimal(row, criterion)


def _subsets_of(row: dict) -> list[str]:
    a, w = subset_key_agents(row), subset_key_wait(row)
    return ["all", a] + ([] if w is None else [w, f"{a}/{w}"])


def read_verdicts(verdicts: Mapping[tuple[str, int], Path], source: str = "final") -> dict[tuple[str, int], list[dict]]:
    """(arm, seed) -> the verdict rows of that pair's `source` evaluation: `final` (the held-out benchmark) or
    `final_cpu` (the CPU-scale held-out split beside it; pairs without one are left out)."""
    return {k: read_jsonl(folder / source / "eval.jsonl") for k, folder in sorted(verdicts.items())
            if (folder / source / "eval.jsonl").is_file()}


def _cells(rows: list[dict], metric: str, criterion: str, key) -> dict[Any, list[tuple[str, bool]]]:
    """Rows grouped by `key(row)` (a list of groups per row) as [(id, success), ...]."""
    out: dict[Any, list[tuple[str, bool]]] = {}
    for j, r in enumerate(rows):
        for g in key(r):
            out.setdefault(g, []).append((str(r.get("id", j)), _success(r, metric, criterion)))
    return out


def _counts(cells: Mapping[Any, list[tuple[str, bool]]]) -> dict[Any, tuple[int, int]]:
    return {g: (len(v), sum(ok for _, ok in v)) for g, v in cells.items()}


def summarize(verdicts: Mapping[tuple[str, int], Path], arm_order: Sequence[str], baseline: str | None,
              criterion: str | None = None) -> dict:
    """`summarize_rows` of the verdict folders' `final/eval.jsonl`, with `sampled` (`summarize_sampled`) where the
    held-out questions were also answered by sampling (`final/eval_sampled.jsonl`)."""
    table = summarize_rows(read_verdicts(verdicts), arm_order, baseline, criterion)
    sampled = summarize_sampled(verdicts, table["arms"], baseline)
    return {**table, "sampled": sampled} if sampled else table


def summarize_sampled(verdicts: Mapping[tuple[str, int], Path], arms: Sequence[str],
                      baseline: str | None) -> dict | None:
    """Per arm, mean@k on the held-out split: each question's share of right sampled answers, the mean over
    questions and then over seeds, with its 95 % interval over seeds and the questions they share (questions, not
    answers, are the units drawn: a question's samples stay together), and the gap to `baseline` paired by seed
    and question. None where no pair sampled. {"k", "temperature", "rows": {arm: rate_interval + gap}}."""
    per: dict[str, dict[int, dict[str, list[tuple[str, float]]]]] = {}
    ks, temps = set(), set()
    for (arm, seed), folder in sorted(verdicts.items()):
        path = folder / "final" / "eval_sampled.jsonl"
        if not path.is_file():
            continue
        right: dict[str, list[bool]] = {}
        for r in read_jsonl(path):
            right.setdefault(str(r["id"]), []).append(bool(r.get("valid")))
        ks.update(len(v) for v in right.values())
        temps.add((read_json(folder / "final" / "metrics.json") or {}).get("final/sample_temperature"))
        per.setdefault(arm, {})[seed] = {"all": [(i, sum(v) / len(v)) for i, v in right.items()]}
    if not per:
        return None
    rows = {}
    for arm in [a for a in arms if a in per]:
        rows[arm] = rate_interval(per[arm])
        if baseline in per and arm != baseline:
            rows[arm]["gap"] = gap_interval(per[arm], per[baseline])
    return {"k": sorted(ks), "temperature": sorted(t for t in temps if t is not None), "rows": rows}


def summarize_rows(data: Mapping[tuple[str, int], list[dict]], arm_order: Sequence[str], baseline: str | None,
                   criterion: str | None = None) -> dict:
    """Per arm, from `(arm, seed) -> verdict rows`: per-size rates and their Sum per agent count, pooled rates
    per subset, each with its 95% interval over seeds and instances and the gap to `baseline` paired by
    seed; failure shares.

    `criterion` ('soc' | 'makespan'; None: `default_criterion` of all rows) is what `optimal` means."""
    all_rows = [r for rows in data.values() for r in rows]
    criterion = criterion or default_criterion(all_rows)
    if criterion == "makespan" and default_criterion(all_rows) != "makespan":
        raise ValueError("criterion 'makespan': some verdict rows have no makespan fields (older verdict files); "
                         "tabulate them under 'soc'")
    labels = {label for label, _ in data}
    arms = [a for a in arm_order if a in labels] + sorted(a for a in labels if a not in arm_order)
    subsets = subset_order((k for r in all_rows for k in _subsets_of(r)), paper=True)
    agents = [s for s in subsets if s.startswith("agents_") and "/" not in s]
    sizes = {a: sorted({row_level(r) for r in all_rows if subset_key_agents(r) == a and _has_level(r)})
             for a in agents}
    # (arm, metric, layout) -> seed -> group -> [(id, success)]
    grouped: dict[tuple[str, str, str], dict[int, dict[Any, list[tuple[str, bool]]]]] = {}
    for (label, seed), rows in data.items():
        for metric in METRICS:
            grouped.setdefault((label, metric, "pooled"), {})[seed] = _cells(rows, metric, criterion, _subsets_of)
            grouped.setdefault((label, metric, "size"), {})[seed] = _cells(
                rows, metric, criterion, lambda r: [(subset_key_agents(r), row_level(r))] if _has_level(r) else [])
    base_ok = bool(baseline) and baseline in labels

    def stat(label: str, metric: str, layout: str, pick) -> dict[str, Any]:
        """`pick(seed_groups) -> {stratum: [(id, success)]}` chooses the strata of one cell."""
        per_seed = {s: pick(g) for s, g in grouped[(label, metric, layout)].items()}
        st = rate_interval(per_seed)
        st["n_instances"] = {str(s): sum(len(v) for v in c.values()) for s, c in sorted(per_seed.items()) if c}
        if base_ok and label != baseline:
            base = {s: pick(g) for s, g in grouped[(baseline, metric, layout)].items()}
            st["gap"] = gap_interval(per_seed, base)
        return st

    table: dict[str, Any] = {"arms": arms, "subsets": subsets, "baseline": baseline, "criterion": criterion,
                             "criterion_name": CRITERION_NAMES[criterion], "interval": INTERVAL_NOTE,
                             "sizes": {a: sizes[a] for a in agents}, "rows": {}, "per_size": {}}
    for label in arms:
        row: dict[str, Any] = {"seeds": sorted(s for lbl, s in data if lbl == label)}
        for sub in subsets:
            row[sub] = {m: stat(label, m, "pooled", lambda g, sub=sub: {sub: g[sub]} if sub in g else {})
                        for m in METRICS}
        table["rows"][label] = row
        table["per_size"][label] = {
            a: {m: {"sizes": {str(z): stat(label, m, "size", lambda g, a=a, z=z: {z: g[(a, z)]} if (a, z) in g else {})
                              for z in sizes[a]},
                    "sum": stat(label, m, "size", lambda g, a=a: {z: v for (aa, z), v in g.items() if aa == a})}
                for m in METRICS}
            for a in agents}
    table["failures"] = failure_shares(data, arms)
    return table


def failure_shares(data: Mapping[tuple[str, int], list[dict]], arm_order: Sequence[str]) -> dict:
    """Where the held-out answers fail: per arm, the share of final-benchmark answers by the first check they
    fail (`valid` when none; the checker's order, env.verify.CHECK_ORDER), as the mean over seeds with the
    same 95% interval as the rates. It separates arms whose valid rates are all zero (a policy that now
    writes every agent's path but collides differs from one that still drops agents)."""
    from env.verify import CHECK_ORDER

    per: dict[str, dict[int, list[tuple[str, str]]]] = {}
    for (label, seed), rows in sorted(data.items()):
        if rows:
            per.setdefault(label, {})[seed] = [(str(r.get("id", j)), "valid" if r.get("valid") else
                                                (r.get("failure") or "unknown")) for j, r in enumerate(rows)]
    seen = {k for seeds in per.values() for answers in seeds.values() for _, k in answers}
    kinds = ["valid", *(k for k in CHECK_ORDER if k in seen), *sorted(seen - set(CHECK_ORDER) - {"valid"})]
    arms = [a for a in arm_order if a in per] + sorted(a for a in per if a not in arm_order)
    out: dict[str, Any] = {}
    for a in arms:
        seeds = sorted(per[a])
        out[a] = {"seeds": seeds}
        for k in kinds:
            out[a][k] = rate_interval({s: {"all": [(i, kind == k) for i, kind in per[a][s]]} for s in seeds})
    return {"kinds": kinds, "arms": arms, "rows": out}

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


def identical_weight_notes(verdicts: Mapping[tuple[str, int], Path]) -> list[str]:
    """Arms of one seed that ended their last stage with byte-identical weights (`weights.json`, written by
    `evals.grid.record_weights`): they trained on the same data, so any gap between their rows is the
    evaluation's own noise, not a difference the engineers made."""
    groups: dict[int, dict[str, list[str]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        weights = read_json(folder / "weights.json") or {}
        if not weights:
            continue
        last = max(weights, key=lambda key: int(key.split("_")[1]))
        groups.setdefault(seed, {}).setdefault(json.dumps([last, weights[last]], sort_keys=True), []).append(label)
    notes = []
    for seed, by_weights in sorted(groups.items()):
        for key, labels in by_weights.items():
            if len(labels) > 1:
                stage = json.loads(key)[0].replace("_", " ")
                notes.append(f"Identical weights, seed {seed}: {', '.join(labels)} ended {stage} with byte-identical "
                             "checkpoints (sha256 in `verdicts/<pair>/weights.json`): they trained on the same data, "
                             "so the gaps between their rows are the evaluation's own noise.")
    return notes
