"""The tables of a grid, from `evals.stats.summarize`: table.md (the paper's layout first), table.csv (long
form), failures.csv and table.json (everything, per-seed values included).

table.md: per agent count, a row per arm with each size's valid % / optimal % and Sum (the unweighted mean
over sizes, the paper's aggregate), the paper's published rows beneath when asked for; the gap of Sum to
the baseline; then the pooled rates per agent count and per wait subset, their gaps, and where the answers
fail. Every caption names the optimality criterion; every interval is "mean [low, high]" in %.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.published import CAPTION as PUBLISHED_CAPTION
from evals.published import RUNS as PUBLISHED_RUNS
from evals.published import published_rows, wait_rows
from evals.stats import METRICS


def _cell(stat: Mapping[str, Any] | None, signed: bool = False, interval: bool = True) -> str:
    """'12.3 [4.5, 20.1]' (%), '+1.0 [-2.0, +4.0]' (points) when signed, '–' when there is no value."""
    if not stat or stat.get("mean") is None:
        return "–"
    fmt = "{:+.1f}" if signed else "{:.1f}"
    s = fmt.format(100 * stat["mean"])
    if interval and stat.get("low") is not None:
        s += f" [{fmt.format(100 * stat['low'])}, {fmt.format(100 * stat['high'])}]"
    return s


def _pub(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def gap_table(what: str, base: str, crit: str, arm_header: str, arms: Sequence[str], cols: Sequence[str],
              gap: Callable[[str, str, str], Mapping[str, Any] | None]) -> list[str]:
    """A table of gaps to `base`: a row per arm, per column `valid / optimal` of `gap(arm, column, metric)`."""
    lines = [f"**{what} to `{base}` in percentage points (valid / optimal, optimal: {crit}), paired by seed (and by "
             "instance), with its 95% paired-bootstrap interval**", "",
             f"| {arm_header} | " + " | ".join(subset_title(c) for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for arm in arms:
        lines.append(f"| {arm} | " + " | ".join(
            f"{_cell(gap(arm, c, 'valid'), True)} / {_cell(gap(arm, c, 'optimal'), True)}" for c in cols) + " |")
    return lines + [""]


def subset_title(sub: str) -> str:
    if sub == "all":
        return "all"
    parts = []
    for p in sub.split("/"):
        parts.append(f"{p[7:]} agents" if p.startswith("agents_") else f"wait {p[5:]}")
    return ", ".join(parts)


def _per_size_blocks(table: Mapping[str, Any], arm_header: str, published: Sequence[str]) -> list[str]:
    """Per agent count: sizes then Sum, a row per arm, the published rows beneath; the Sum gaps."""
    arms, crit = table["arms"], table["criterion_name"]
    lines = [f"**Per agent count and size (the paper's layout): valid % / optimal % (optimal: {crit}) per size, "
             "then Sum, the unweighted mean of the per-size rates (each seed's Sum, then the mean over seeds, with "
             "its 95% interval)**", ""]
    for a, sizes in table["sizes"].items():
        n_agents = int(a[7:])
        pub = published_rows(n_agents, tuple(published)) if published else []
        cols = sorted(set(sizes) | {z for p in pub for z in p["sizes"]})
        if not cols:
            lines += [f"*{n_agents} agents*: no benchmark instances.", ""]
            continue
        lines += [f"*{n_agents} agents*", "",
                  f"| {arm_header} | seeds | " + " | ".join(f"{z}x{z}" for z in cols) + " | Sum valid | Sum optimal |",
                  "|---|---|" + "---|" * (len(cols) + 2)]
        for arm in arms:
            ps = table["per_size"][arm][a]
            cells = [f"{_cell(ps['valid']['sizes'].get(str(z)), interval=False)} / "
                     f"{_cell(ps['optimal']['sizes'].get(str(z)), interval=False)}" for z in cols]
            lines.append(f"| {arm} | {len(table['rows'][arm]['seeds'])} | " + " | ".join(cells)
                         + f" | {_cell(ps['valid']['sum'])} | {_cell(ps['optimal']['sum'])} |")
        for p in pub:
            cells = [f"{_pub(p['sizes'].get(z, (None, None))[0])} / {_pub(p['sizes'].get(z, (None, None))[1])}"
                     for z in cols]
            lines.append(f"| {p['run']} (published) | – | " + " | ".join(cells)
                         + f" | {_pub(p['sum'][0])} | {_pub(p['sum'][1])} |")
        lines.append("")
    if published:
        lines += [PUBLISHED_CAPTION, ""]
        if table["criterion"] != "makespan":
            lines += [f"Our optimal % here is by {crit}, the paper's by makespan: compare the valid columns only "
                      "(verdict rows with makespan fields give makespan tables).", ""]
    lines.append("Per-size cells show the mean over seeds; their intervals are in table.csv and table.json.")
    lines.append("")
    base = table.get("baseline")
    if base and base in table["rows"]:
        agents = list(table["sizes"])
        lines += gap_table("Gap of Sum", base, crit, arm_header, [a for a in arms if a != base], agents,
                           lambda arm, a, metric: table["per_size"][arm][a][metric]["sum"].get("gap"))
    return lines


def table_markdown(table: Mapping[str, Any], *, title: str, command: str | None, arm_header: str = "engineer",
                   notes: Sequence[str] = (), published: Sequence[str] = (), source: str = "`verdicts/`",
                   caveat: str | None = None) -> str:
    """The tables: per size and Sum per agent count (with `published` runs of `evals.published` beneath),
    pooled per agent count and wait subset, gaps to the baseline, failure shares; a `caveat` in bold under the
    title."""
    arms, subsets, base = table["arms"], table["subsets"], table.get("baseline")
    crit = table["criterion_name"]
    agents = [s for s in subsets if s.startswith("agents_") and "/" not in s]
    waits = [s for s in subsets if s.startswith("wait_")]
    lines = [f"# {title}", ""]
    if caveat:
        lines += [f"**{caveat}**", ""]
    if command:
        lines += ["Command:", "", f"    {command}", ""]
    lines += [
        f"Valid % / optimal % on the held-out benchmark. Optimality criterion: **{crit}** (an answer is optimal "
        f"when it is valid and its {crit} equals the instance's optimum). Intervals: {table['interval']}; "
        f"shown as mean [low, high], always inside [0, 100]. Computed from the per-instance verdict files in "
        f"{source} only.",
        "",
    ]
    lines += _per_size_blocks(table, arm_header, published)

    def block(cols: list[str], caption: str, pub: Sequence[Mapping[str, Any]] = ()) -> None:
        if not cols:
            return
        lines.extend([caption, ""])
        lines.append(f"| {arm_header} | seeds | " + " | ".join(subset_title(c) for c in cols) + " |")
        lines.append("|---|---|" + "---|" * len(cols))
        for a in arms:
            row = table["rows"][a]
            cells = [f"{_cell(row.get(c, {}).get('valid'))} / {_cell(row.get(c, {}).get('optimal'))}" for c in cols]
            lines.append(f"| {a} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
        for p in pub:
            cells = [f"{_pub(p['waits'].get(float(c[5:])))} / –" for c in cols]
            lines.append(f"| {p['run']} (published) | – | " + " | ".join(cells) + " |")
        lines.append("")
        if pub:
            lines.extend(["Rows marked (published): the paper's context ablation (valid % only; how it aggregates over "
                      "agent counts and sizes is not public).", ""])

    block(agents + (["all"] if "all" in subsets else []),
          f"**Pooled over sizes: valid % / optimal % (optimal: {crit}) per agent count** (every instance of the "
          "subset in one rate, not the paper's Sum)")
    block(waits, f"**Pooled over sizes: valid % / optimal % (optimal: {crit}) per wait-ratio subset (all agent counts)**",
          wait_rows(tuple(published)))
    if base and base in table["rows"]:
        cols = agents + waits + (["all"] if "all" in subsets else [])
        lines += gap_table("Pooled gap", base, crit, arm_header, [a for a in arms if a != base], cols,
                           lambda arm, c, metric: table["rows"][arm].get(c, {}).get(metric, {}).get("gap"))
    elif base:
        lines += [f"No gap columns: the baseline `{base}` has no finished run.", ""]
    lines += _sampled_block(table.get("sampled"), arm_header, base)
    fails = table.get("failures") or {}
    if fails.get("arms"):
        lines += ["**Where the answers fail: share of held-out answers (%) by the first check they fail** "
                  "(`valid`: none; the checker's order), mean over seeds [95% interval]", ""]
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


def _sampled_block(sampled: Mapping[str, Any] | None, arm_header: str, base: str | None) -> list[str]:
    """The mean@k table, where the held-out questions were also answered by sampling."""
    if not sampled:
        return []
    k = "/".join(map(str, sampled["k"]))
    t = "/".join(f"{x:g}" for x in sampled["temperature"]) or "?"
    rows = sampled["rows"]
    gap = bool(base) and any("gap" in st for st in rows.values())
    out = [f"**Sampled valid % (mean@{k} at temperature {t})** on the held-out split: each question's share of right "
           "sampled answers; intervals over seeds and questions (a question's samples drawn together)", "",
           f"| {arm_header} | seeds | mean@{k} %" + (f" | gap to {base} (points)" if gap else "") + " |",
           "|---|---|---|" + ("---|" if gap else "")]
    for a, st in rows.items():
        out.append(f"| {a} | {st['n']} | {_cell(st)}" + (f" | {_cell(st.get('gap'), True)}" if gap else "") + " |")
    return [*out, ""]


def _csv_row(arm: str, layout: str, subset: str, size: Any, metric: str, crit: str, st: Mapping[str, Any]) -> dict:
    gap = st.get("gap") or {}
    return {"arm": arm, "layout": layout, "subset": subset, "size": size, "metric": metric, "criterion": crit,
            "n_seeds": st["n"], "n_instances": sum((st.get("n_instances") or {}).values()), "mean": st["mean"], "ci95_low": st["low"], "ci95_high": st["high"],
            "interval": st.get("method"), "gap_mean": gap.get("mean"), "gap_ci95_low": gap.get("low"),
            "gap_ci95_high": gap.get("high"), "per_seed": json.dumps(st["per_seed"])}


def table_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Long form for CSV: one row per (arm, layout, subset, size, metric). layout `size`: one size of one agent
    count; `sum`: the paper's Sum over sizes (size empty); `pooled`: every instance of the subset in one rate."""
    out, crit = [], table["criterion"]
    for a in table["arms"]:
        for sub, per in table["per_size"][a].items():
            for metric in METRICS:
                for z, st in per[metric]["sizes"].items():
                    out.append(_csv_row(a, "size", sub, z, metric, crit, st))
                out.append(_csv_row(a, "sum", sub, None, metric, crit, per[metric]["sum"]))
        row = table["rows"][a]
        for sub in table["subsets"]:
            for metric in METRICS:
                st = row.get(sub, {}).get(metric)
                if st:
                    out.append(_csv_row(a, "pooled", sub, None, metric, crit, st))
        st = ((table.get("sampled") or {}).get("rows") or {}).get(a)
        if st:  # mean@k: each question's share of right sampled answers
            out.append(_csv_row(a, "pooled", "all", None, "sampled_valid", crit, st))
    return out


def published_payload(table: Mapping[str, Any], runs: Sequence[str]) -> dict[str, Any]:
    return {"caption": PUBLISHED_CAPTION, "rows": {a: published_rows(int(a[7:]), tuple(runs)) for a in table["sizes"]},
            "wait_rows": wait_rows(tuple(runs))}


def write_tables(table: Mapping[str, Any], out: Path, *, title: str, command: str | None,
                 arm_header: str = "engineer", notes: Sequence[str] = (), extra: Mapping[str, Any] | None = None,
                 published: Sequence[str] | bool = (), source: str = "`verdicts/`", caveat: str | None = None) -> None:
    """`<out>/table.md`, `table.csv` (long form), `failures.csv` and `table.json` (everything: per-seed values,
    the criterion, the notes, the published rows shown). `published`: the runs of `evals.published` shown
    beneath ours (True: the engineer runs), none by default."""
    runs = tuple(PUBLISHED_RUNS["engineers"] if published is True else (published or ()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table_markdown(table, title=title, command=command, arm_header=arm_header,
                                                 notes=notes, published=runs, source=source, caveat=caveat))
    rows = table_rows(table)
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["arm"])
        w.writeheader()
        w.writerows(rows)
    fails = table.get("failures") or {}
    if fails.get("arms"):
        with open(out / "failures.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["arm", "failure", "n_seeds", "mean", "ci95_low", "ci95_high",
                                              "interval", "per_seed"])
            w.writeheader()
            for a in fails["arms"]:
                for k in fails["kinds"]:
                    st = fails["rows"][a][k]
                    w.writerow({"arm": a, "failure": k, "n_seeds": st["n"], "mean": st["mean"], "ci95_low": st["low"],
                                "ci95_high": st["high"], "interval": st.get("method"),
                                "per_seed": json.dumps(st["per_seed"])})
    payload = {"title": title, **({"caveat": caveat} if caveat else {}), "command": command, **dict(extra or {}),
               "notes": list(notes),
               "arm_header": arm_header, "criterion": table["criterion"],
               "published": published_payload(table, runs) if runs else None, "table": table}
    (out / "table.json").write_text(json.dumps(payload, indent=2) + "\n")
