"""The tables of a grid, from `evals.stats.summarize`: table.md (the paper's layout), table.csv (long form),
failures.csv and table.json (everything, per-seed values included).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.stats import METRICS


def _cell(stat: Mapping[str, Any] | None, signed: bool = False) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    m = 100 * stat["mean"]
    s = f"{m:+.1f}" if signed else f"{m:.1f}"
    return s + ("" if stat.get("half") is None else f" ± {100 * stat['half']:.1f}")


def subset_title(sub: str) -> str:
    if sub == "all":
        return "all"
    parts = []
    for p in sub.split("/"):
        parts.append(f"{p[7:]} agents" if p.startswith("agents_") else f"wait {p[5:]}")
    return ", ".join(parts)


def table_markdown(table: Mapping[str, Any], *, title: str, command: str | None, arm_header: str = "engineer",
                   notes: Sequence[str] = ()) -> str:
    """The paper-style tables: valid % / optimal % per agent count, per wait subset, and gaps to baseline."""
    arms, subsets, base = table["arms"], table["subsets"], table.get("baseline")
    agents = [s for s in subsets if s.startswith("agents_") and "/" not in s]
    waits = [s for s in subsets if s.startswith("wait_")]
    lines = [f"# {title}", ""]
    if command:
        lines += ["Command:", "", f"    {command}", ""]
    lines += [
        "Valid % / optimal % on the held-out benchmark, pooled over sizes; mean ± half-width of the 95% "
        "Student-t interval over seeds (no interval with one seed). Computed from the per-instance verdict "
        "files in `verdicts/` only.",
        "",
    ]

    def block(cols: list[str], metric_pairs: bool, caption: str) -> None:
        if not cols:
            return
        lines.extend([caption, ""])
        lines.append(f"| {arm_header} | seeds | " + " | ".join(subset_title(c) for c in cols) + " |")
        lines.append("|---|---|" + "---|" * len(cols))
        for a in arms:
            row = table["rows"][a]
            cells = []
            for c in cols:
                cell = row.get(c, {})
                if metric_pairs:
                    cells.append(f"{_cell(cell.get('valid'))} / {_cell(cell.get('optimal'))}")
                else:
                    cells.append(_cell(cell.get("valid")))
            lines.append(f"| {a} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
        lines.append("")

    block(agents + (["all"] if "all" in subsets else []), True, "**Valid % / optimal % per agent count**")
    block(waits, True, "**Valid % / optimal % per wait-ratio subset (all agent counts)**")
    if base and base in table["rows"]:
        cols = agents + waits + (["all"] if "all" in subsets else [])
        lines.append(f"**Gap to `{base}` in percentage points (valid / optimal), mean of per-seed paired "
                     "differences ± 95% t half-width**")
        lines.append("")
        lines.append(f"| {arm_header} | " + " | ".join(subset_title(c) for c in cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for a in arms:
            if a == base:
                continue
            row = table["rows"][a]
            cells = [f"{_cell(row.get(c, {}).get('valid', {}).get('gap'), True)} / "
                     f"{_cell(row.get(c, {}).get('optimal', {}).get('gap'), True)}" for c in cols]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
        lines.append("")
    elif base:
        lines += [f"No gap columns: the baseline `{base}` has no finished run.", ""]
    fails = table.get("failures") or {}
    if fails.get("arms"):
        lines += ["**Where the answers fail: share of held-out answers (%) by the first check they fail** "
                  "(`valid`: none; the checker's order), mean ± 95% t half-width over seeds", ""]
        lines.append(f"| {arm_header} | seeds | " + " | ".join(f"`{k}`" for k in fails["kinds"]) + " |")
        lines.append("|---|---|" + "---|" * len(fails["kinds"]))
        for a in fails["arms"]:
            r = fails["rows"][a]
            lines.append(f"| {a} | {len(r['seeds'])} | " + " | ".join(_cell(r[k]) for k in fails["kinds"]) + " |")
        lines.append("")
    ninst: dict[str, set[int]] = {c: set() for c in subsets if "/" not in c}
    for a in arms:
        for c in ninst:
            for n in (table["rows"][a].get(c, {}).get("valid", {}).get("n_instances") or {}).values():
                ninst[c].add(n)
    if ninst and arms:
        desc = ", ".join(f"{subset_title(c)}: n={'/'.join(str(n) for n in sorted(v)) if v else 0}"
                         for c, v in ninst.items())
        lines += [f"Instances per seed and subset: {desc}.", ""]
        empty = [subset_title(c) for c, v in ninst.items() if not v or v == {0}]
        if empty:
            lines += [f"No benchmark instances (n=0, shown as –) in: {', '.join(empty)}.", ""]
    for note in notes:
        lines.append(f"- {note}")
    if notes:
        lines.append("")
    return "\n".join(lines)


def table_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Long form for CSV: one row per (arm, subset, metric)."""
    out = []
    for a in table["arms"]:
        row = table["rows"][a]
        for sub in table["subsets"]:
            for metric in METRICS:
                st = row.get(sub, {}).get(metric)
                if not st:
                    continue
                gap = st.get("gap") or {}
                out.append({
                    "arm": a, "subset": sub, "metric": metric, "n_seeds": st["n"],
                    "mean": st["mean"], "ci95_low": st["low"], "ci95_high": st["high"], "ci95_half": st["half"],
                    "gap_mean": gap.get("mean"), "gap_ci95_half": gap.get("half"),
                    "per_seed": json.dumps(st["per_seed"]),
                })
    return out


def write_tables(table: Mapping[str, Any], out: Path, *, title: str, command: str | None,
                 arm_header: str = "engineer", notes: Sequence[str] = (), extra: Mapping[str, Any] | None = None) -> None:
    """`<out>/table.md`, `table.csv` (long form) and `table.json` (everything, per-seed values included)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table_markdown(table, title=title, command=command, arm_header=arm_header,
                                                 notes=notes))
    rows = table_rows(table)
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["arm"])
        w.writeheader()
        w.writerows(rows)
    fails = table.get("failures") or {}
    if fails.get("arms"):
        with open(out / "failures.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["arm", "failure", "n_seeds", "mean", "ci95_half", "per_seed"])
            w.writeheader()
            for a in fails["arms"]:
                for k in fails["kinds"]:
                    st = fails["rows"][a][k]
                    w.writerow({"arm": a, "failure": k, "n_seeds": st["n"], "mean": st["mean"],
                                "ci95_half": st["half"], "per_seed": json.dumps(st["per_seed"])})
    payload = {"title": title, "command": command, **dict(extra or {}), "table": table}
    (out / "table.json").write_text(json.dumps(payload, indent=2) + "\n")
