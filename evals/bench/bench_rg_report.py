"""Tables of one `bench_rg` stage per arm: the change from the shared warm start, and each arm against the first.

    python -m evals.bench.bench_rg_report uniform.json learnability.json hardest.json [--markdown out.md]

Each file is one arm (`python -m evals.bench.bench_rg --json`), every arm answered the same questions from the same
start (`--start-from`). Printed, as markdown: the greedy valid rate and mean@k of the start and after each arm's
stage, overall and per level, each change with its 95 % interval (a two-way bootstrap: each draw takes the arm's
seeds with replacement and, once for all of them, the questions they share, `evals.intervals.crossed_interval`);
then each arm's difference from the first arm, paired by seed number and question.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from evals.intervals import crossed_interval


def load(path: str) -> dict:
    """A bench_rg file, or a member of a packed results folder (`FOLDER/answers.tar.xz:MEMBER`, evals.packed)."""
    from evals.packed import read_text

    try:
        data = json.loads(read_text(path))
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read a bench_rg file ({e}); allowed: a file written by bench_rg --json") from None
    if not data.get("start") or not data.get("seeds"):
        raise SystemExit(f"{path}: no start or no finished seed; allowed: a bench_rg --json file with both")
    return data


def scores(r: dict, sampled: bool) -> list[float] | None:
    """Per question: 1/0 greedy, or the share of the k sampled answers that were right."""
    if not sampled:
        return [float(v) for v in r["valid"]]
    s = r.get("sampled")
    return None if not s else [c / s["k"] for c in s["valid_counts"]]


def cell(rows: list[list[float]]) -> str:
    mean = statistics.fmean(statistics.fmean(r) for r in rows)
    lo, hi = crossed_interval(rows)
    return f"{100 * mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def rate(values: list[float]) -> str:
    return f"{100 * statistics.fmean(values):.1f}"


def tables(arms: dict[str, dict]) -> str:
    first = next(iter(arms.values()))
    levels = first.get("eval_levels")
    for name, a in arms.items():
        if a.get("eval_ids") != first.get("eval_ids") or a["start"]["valid"] != first["start"]["valid"]:
            raise SystemExit(f"{name}: answered other questions or from another start than "
                             f"{next(iter(arms))}; allowed: arms of one start (bench_rg --start-from)")
    groups = {"all": list(range(len(first["start"]["valid"])))}
    if levels:
        for lv in sorted(set(levels)):
            groups[f"level {lv}"] = [i for i, x in enumerate(levels) if x == lv]
    out = []
    for sampled in (False, True):
        start = scores(first["start"], sampled)
        if start is None:
            continue
        k = first["start"]["sampled"]["k"] if sampled else 0
        what = f"mean@{k} (T {first['start']['sampled']['temperature']:g})" if sampled else "greedy valid rate"
        out.append(f"### {what}, % (change from the start, with its 95 % interval)\n")
        out.append("| | " + " | ".join(groups) + " |")
        out.append("|---" * (len(groups) + 1) + "|")
        out.append("| start | " + " | ".join(rate([start[i] for i in ix]) for ix in groups.values()) + " |")
        per_arm = {}
        for name, a in arms.items():
            seeds = sorted(a["seeds"], key=int)
            after = {s: scores(a["seeds"][s], sampled) for s in seeds}
            if any(v is None for v in after.values()):
                continue
            per_arm[name] = after
            out.append(f"| {name} ({len(seeds)} seeds) | " + " | ".join(
                f"{rate([statistics.fmean(after[s][i] for s in seeds) for i in ix])}: "
                + cell([[after[s][i] - start[i] for i in ix] for s in seeds]) for ix in groups.values()) + " |")
        base_name = next(iter(per_arm), None)
        if base_name and len(per_arm) > 1:
            out.append(f"\n{what}: each arm minus {base_name}, in points, paired by seed and question\n")
            out.append("| | " + " | ".join(groups) + " |")
            out.append("|---" * (len(groups) + 1) + "|")
            base = per_arm[base_name]
            for name, after in list(per_arm.items())[1:]:
                seeds = [s for s in after if s in base]
                out.append(f"| {name} - {base_name} | " + " | ".join(
                    cell([[after[s][i] - base[s][i] for i in ix] for s in seeds]) for ix in groups.values()) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.bench.bench_rg_report", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="bench_rg --json files, one per arm, or members of a packed results "
                   "folder (FOLDER/answers.tar.xz:uniform.json); the first is the base")
    p.add_argument("--markdown", type=Path, default=None, help="also write the tables to this file")
    a = p.parse_args(argv)
    names = [Path(f.rsplit(":", 1)[-1]).stem for f in a.files]
    if len(set(names)) != len(names):
        p.error(f"arms {names}: allowed: files of distinct names (the name is the arm's)")
    text = tables({n: load(f) for n, f in zip(names, a.files, strict=True)})
    print(text)
    if a.markdown:
        a.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
