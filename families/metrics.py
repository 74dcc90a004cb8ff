"""Aggregation of verdict rows (pure): the metrics of an evaluation and the paper's tables of the final benchmark.

`compute_metrics(rows)` / `compute_final_metrics(rows)` are pure functions of the rows of an `eval.jsonl`
(`nodes.evaluate`), so any table can be recomputed from the saved answers; `final_table_md` writes the paper's
tables. `nodes.evaluate` re-exports all three.

A row names its level in `level` (MAPF's level is the grid size); the metrics hold a `by_level` table and flat
`<prefix>/valid_rate/level_<k>` figures. Files written before these names (rows with `size`, metrics with `by_size`
and `.../size_<k>`) still load: `row_level` and `upgrade_metrics` read both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from env import FAILURES


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (inside [0, 1] by construction)."""
    if n == 0:
        return (0.0, 0.0)
    lo, hi = _wilson_rate(k / n, n, z)
    return (0.0 if k == 0 else lo, 1.0 if k == n else hi)


def row_level(row: dict) -> int:
    """A verdict row's level: `level`, or `size` in a row written before that name."""
    return int(row["level"] if "level" in row else row["size"])


_OLD_FLAT = re.compile(r"^(.*/(?:valid|optimal)_rate)/size_(-?\d+)$")


def upgrade_metrics(metrics: Any) -> Any:
    """Metrics as this version writes them, from a file or state of either age: `by_size` tables (nested ones
    too) become `by_level`, flat `.../size_<k>` figures become `.../level_<k>`; current metrics come back unchanged.

    >>> upgrade_metrics({"eval/valid_rate/size_3": 0.5, "by_size": {"3": {"n": 2}}})
    {'eval/valid_rate/level_3': 0.5, 'by_level': {'3': {'n': 2}}}
    """
    if isinstance(metrics, list):
        return [upgrade_metrics(v) for v in metrics]
    if not isinstance(metrics, dict):
        return metrics
    out: dict[Any, Any] = {}
    for k, v in metrics.items():
        if k == "by_size" and "by_level" not in metrics:
            k = "by_level"
        elif isinstance(k, str) and (m := _OLD_FLAT.match(k)):
            k = f"{m.group(1)}/level_{m.group(2)}"
        out[k] = upgrade_metrics(v)
    return out


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def _aggregate(rows: Iterable[dict], labels: Sequence[str] = FAILURES) -> dict[str, Any]:
    rows = list(rows)
    n = len(rows)
    valid = sum(1 for r in rows if r.get("valid"))
    optimal = sum(1 for r in rows if r.get("optimal"))
    failures = {name: 0 for name in labels}
    for r in rows:
        if r.get("failure"):
            failures[r["failure"]] = failures.get(r["failure"], 0) + 1
    return {
        "n": n,
        "valid": valid,
        "optimal": optimal,
        "valid_rate": _rate(valid, n),
        "optimal_rate": _rate(optimal, n),
        "failures": failures,
    }


def compute_metrics(rows: Sequence[dict], prefix: str = "eval", labels: Sequence[str] = FAILURES) -> dict[str, Any]:
    """Flat metrics plus a per-level table (`by_level`) from verdict rows (the rows of an `eval.jsonl`). `labels`:
    the task's failure labels (MAPF's `env.FAILURES`).

    >>> m = compute_metrics([{"level": 3, "valid": True, "optimal": False, "failure": None},
    ...                      {"level": 3, "valid": False, "optimal": False, "failure": "conflict"}])
    >>> m["eval/valid_rate"], m["eval/valid_rate/level_3"], m["eval/failure/conflict"]
    (0.5, 0.5, 1)
    """
    total = _aggregate(rows, labels)
    by_level: dict[str, dict] = {}
    for level in sorted({row_level(r) for r in rows}):
        by_level[str(level)] = _aggregate((r for r in rows if row_level(r) == level), labels)
    out: dict[str, Any] = {
        f"{prefix}/n": total["n"],
        f"{prefix}/valid_rate": total["valid_rate"],
        f"{prefix}/optimal_rate": total["optimal_rate"],
    }
    for level, agg in by_level.items():
        out[f"{prefix}/valid_rate/level_{level}"] = agg["valid_rate"]
        out[f"{prefix}/optimal_rate/level_{level}"] = agg["optimal_rate"]
    for name, count in total["failures"].items():
        out[f"{prefix}/failure/{name}"] = count
    tokens = [r["completion_tokens"] for r in rows if r.get("completion_tokens") is not None]
    if tokens:
        out[f"{prefix}/completion_tokens_mean"] = sum(tokens) / len(tokens)
    if any(r.get("finish_reason") for r in rows):
        out[f"{prefix}/truncated_rate"] = _rate(
            sum(1 for r in rows if r.get("finish_reason") == "length"), len(rows)
        )
    out["by_level"] = by_level
    return out


def _wait_key(row: dict) -> str | None:
    wait = (row.get("tags") or {}).get("wait")
    return None if wait is None else f"{float(wait):.2f}"


def _agents_key(row: dict) -> int:
    return int((row.get("tags") or {}).get("agents") or row.get("num_agents") or 2)


def compute_final_metrics(rows: Sequence[dict], prefix: str = "final") -> dict[str, Any]:
    """The benchmark's tables: overall, per agent count, per wait subset and per (agents, wait), each with
    its per-level breakdown; flat names `final/valid_rate/agents_3`, `final/optimal_rate/wait_0.25`, ...

    >>> rows = [{"level": 3, "num_agents": 3, "tags": {"agents": 3, "wait": 0.25}, "valid": True,
    ...          "optimal": True, "failure": None}]
    >>> compute_final_metrics(rows)["final/valid_rate/agents_3"]
    1.0
    """
    out = compute_metrics(rows, prefix=prefix)
    tables: dict[str, dict[str, Any]] = {"by_agents": {}, "by_wait": {}, "by_agents_wait": {}}
    for a in sorted({_agents_key(r) for r in rows}):
        sub = [r for r in rows if _agents_key(r) == a]
        tables["by_agents"][str(a)] = _with_levels(sub)
        out[f"{prefix}/valid_rate/agents_{a}"] = tables["by_agents"][str(a)]["valid_rate"]
        out[f"{prefix}/optimal_rate/agents_{a}"] = tables["by_agents"][str(a)]["optimal_rate"]
        for w in sorted({k for r in sub if (k := _wait_key(r)) is not None}):
            tables["by_agents_wait"][f"{a}/{w}"] = _with_levels([r for r in sub if _wait_key(r) == w])
    for w in sorted({k for r in rows if (k := _wait_key(r)) is not None}):
        tables["by_wait"][w] = _with_levels([r for r in rows if _wait_key(r) == w])
        out[f"{prefix}/valid_rate/wait_{w}"] = tables["by_wait"][w]["valid_rate"]
        out[f"{prefix}/optimal_rate/wait_{w}"] = tables["by_wait"][w]["optimal_rate"]
    out.update(tables)
    return out


def _with_levels(rows: list[dict]) -> dict[str, Any]:
    agg = _aggregate(rows)
    agg["by_level"] = {
        str(s): _aggregate(r for r in rows if row_level(r) == s)
        for s in sorted({row_level(r) for r in rows})
    }
    return agg


def final_table_md(final: dict[str, Any]) -> str:
    """The paper's tables as markdown: valid % / optimal % per agent count, and per wait subset x agents."""
    lines = ["| agents | n | valid % | optimal % |", "|---|---|---|---|"]
    for a, agg in final.get("by_agents", {}).items():
        lines.append(
            f"| {a} | {agg['n']} | {100 * agg['valid_rate']:.2f} | {100 * agg['optimal_rate']:.2f} |"
        )
    waits = sorted(final.get("by_wait", {}))
    if waits:
        lines += ["", "Valid % / optimal % per wait-ratio subset:", ""]
        lines.append("| agents | " + " | ".join(f"wait {w}" for w in waits) + " |")
        lines.append("|---|" + "---|" * len(waits))
        for a in final.get("by_agents", {}):
            cells = []
            for w in waits:
                agg = final["by_agents_wait"].get(f"{a}/{w}")
                cells.append("-" if agg is None else f"{100 * agg['valid_rate']:.1f} / {100 * agg['optimal_rate']:.1f}")
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
        cells = [f"{100 * final['by_wait'][w]['valid_rate']:.1f} / {100 * final['by_wait'][w]['optimal_rate']:.1f}"
                 for w in waits]
        lines.append("| all | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- mean@k of sampled answers


def mean_at_k_interval(counts: Sequence[int], k: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % interval of mean@k from each question's count of valid answers among its `k` samples (0..k).

    The samples of one question are not independent (an easy question is right in most of them), so a Wilson
    interval over the n x k answers is too narrow. This one counts both: the variance of the mean comes from the
    spread of the per-question rates (the between-question variance), turned into an effective number of trials
    (the n x k answers over the design effect, kept between n, every sample of a question alike, and n x k,
    independent samples), and that goes into Wilson's interval, which stays inside [0, 1]. Where the spread says
    nothing (every question 0 of k, or every one k of k), the n questions are the trials.

    >>> [round(x, 3) for x in mean_at_k_interval([4, 0, 2, 2], 4)]  # rate 0.5, 6 effective trials
    [0.188, 0.812]
    >>> mean_at_k_interval([], 4)
    (0.0, 1.0)
    """
    n = len(counts)
    if n == 0 or k < 1:
        return (0.0, 1.0)
    rates = [c / k for c in counts]
    mean = sum(rates) / n
    spread = sum((r - mean) ** 2 for r in rates) / (n - 1) if n > 1 else 0.0
    if mean in (0.0, 1.0):
        trials = float(n)
    elif spread == 0.0:
        trials = float(n * k)
    else:
        trials = min(float(n * k), max(float(n), mean * (1 - mean) / (spread / n)))
    return _wilson_rate(mean, trials, z)


def _wilson_rate(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's score interval of a rate `p` over `n` trials (`n` need not be whole: an effective number)."""
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def sampled_metrics(metrics: dict[str, Any], rows: Sequence[dict], k: int, temperature: float,
                    prefix: str = "eval") -> dict[str, Any]:
    """`metrics` (`compute_metrics`) with the mean@k of sampled answers beside the greedy figures: `rows` are the
    verdict rows of an `eval_sampled.jsonl`, `k` per question (each with its question's `id` and `sample` index).

    Adds `<prefix>/sampled_valid_rate` (valid share of all questions x samples), its 95 % interval
    (`.../sampled_valid_rate_low`, `_high`: `mean_at_k_interval`), `<prefix>/sampled_valid_rate/level_<l>`,
    `<prefix>/samples_k`, `<prefix>/sample_temperature`, `<prefix>/sampled_n` (answers), and to each `by_level` row
    `sampled_valid_rate`, `sampled_n`, `sampled_low`, `sampled_high`. A pure function of the saved rows.

    >>> rows = [{"id": q, "sample": s, "level": 1, "valid": s < c} for q, c in (("a", 2), ("b", 1)) for s in range(2)]
    >>> m = sampled_metrics({"by_level": {"1": {"n": 2}}}, rows, 2, 0.7)
    >>> m["eval/sampled_valid_rate"], m["by_level"]["1"]["sampled_valid_rate"], m["eval/samples_k"]
    (0.75, 0.75, 2)
    """
    counts: dict[Any, int] = {}
    level_of: dict[Any, int] = {}
    for r in rows:
        counts[r["id"]] = counts.get(r["id"], 0) + (1 if r.get("valid") else 0)
        level_of[r["id"]] = row_level(r)

    def figures(ids: list[Any]) -> tuple[float, float, float]:
        c = [counts[i] for i in ids]
        lo, hi = mean_at_k_interval(c, k)
        return _rate(sum(c), k * len(c)), lo, hi

    out = {**metrics, "by_level": {lv: dict(agg) for lv, agg in (metrics.get("by_level") or {}).items()}}
    rate, lo, hi = figures(list(counts))
    out.update({f"{prefix}/sampled_valid_rate": rate, f"{prefix}/sampled_valid_rate_low": lo,
                f"{prefix}/sampled_valid_rate_high": hi, f"{prefix}/samples_k": k,
                f"{prefix}/sample_temperature": temperature, f"{prefix}/sampled_n": len(rows)})
    for level in sorted(set(level_of.values())):
        ids = [i for i, lv in level_of.items() if lv == level]
        rate, lo, hi = figures(ids)
        out[f"{prefix}/sampled_valid_rate/level_{level}"] = rate
        out["by_level"].setdefault(str(level), {}).update(
            {"sampled_valid_rate": rate, "sampled_n": k * len(ids), "sampled_low": lo, "sampled_high": hi})
    return out
