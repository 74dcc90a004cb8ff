"""Every `bench_learning` arm at a glance: a forest plot of the GRPO stage's gain over its warm start.

    python -m evals.bench.plot_learning a.json b.json --out gains.png --target 5
    python -m evals.bench.plot_learning 'evals/results/learning_cpu/answers.tar.xz:bench_learning*.json' \
        --exclude _seed --out gains.png      # every arm packed in a results folder's archive (evals.packed)

One row per file given (a `bench_learning --json` or `--pool` file), top to bottom in the order given: each seed's
gain in greedy valid rate as a dot, the mean as a square with its 95 % interval (the two-way bootstrap over
seeds and the instances they share, `evals.intervals.crossed_interval`, recomputed from the seeds' per-instance
differences; a file without them keeps the interval it recorded, and its label says so), a line at 0 and a dotted line at `--target` (+5 points, the gain the
cpu-long preset was built to reach). Each row is labelled with the file's name, its GRPO steps, its warm start's SFT steps and its seeds.
The figures are the files' own: nothing is trained or answered again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from evals.intervals import crossed_interval
from evals.packed import PackError, expand, read_text, split_spec

PREFIX = "bench_learning_"


class NotAnArm(ValueError):
    """A file that is not a bench_learning result: one line naming it and what is allowed."""


def arm(path: Path) -> dict[str, Any]:
    """The row of one bench_learning file: label, per-seed gains and mean (points), interval (points or None)."""
    try:
        data = json.loads(read_text(path))
    except (OSError, json.JSONDecodeError) as e:
        raise NotAnArm(f"{path}: cannot be read as JSON ({e.__class__.__name__}); allowed: a --json or --pool file "
                       "of evals.bench.bench_learning") from None
    seeds = data.get("seeds") if isinstance(data, dict) else None
    if not seeds or not all(isinstance(s, dict) and isinstance(s.get("gain"), (int, float)) for s in seeds):
        raise NotAnArm(f"{path}: no finished seed with a 'gain'; allowed: a --json or --pool file of "
                       "evals.bench.bench_learning with at least one finished seed")
    gains = [100 * s["gain"] for s in seeds]
    cfg = data.get("train_config") or {}
    interval = data.get("gain_interval_bootstrap_95")
    diffs = [s.get("diffs") for s in seeds]
    recomputed = all(isinstance(d, list) and d and len(d) == len(diffs[0]) for d in diffs)
    if recomputed:
        interval = list(crossed_interval(diffs))
    steps = cfg.get("max_steps")
    sft = cfg.get("sft_steps")
    name = Path(split_spec(path)[1] or path).stem.removeprefix(PREFIX)
    detail = ", ".join([f"{steps if steps else '?'} GRPO steps", f"{sft if sft else '?'}-step start",
                        f"{len(gains)} seed{'s' if len(gains) != 1 else ''}"]
                       + ([] if recomputed or not interval else ["recorded interval"]))
    return {
        "label": f"{name} ({detail})",
        "gains": gains,
        "mean": sum(gains) / len(gains),
        "interval": [100 * interval[0], 100 * interval[1]] if interval else None,
    }


def write_plot(arms: list[dict[str, Any]], out: Path, target: float | None = 5.0) -> Path:
    """Draw `arms` (from `arm`) as one forest plot into `out` (png, svg or pdf, by its suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.32 * len(arms) + 1.6))
    for i, a in enumerate(arms):
        y = len(arms) - 1 - i
        above = a["interval"] is not None and a["interval"][0] > 0
        color = "tab:green" if above else "tab:blue"
        ax.scatter(a["gains"], [y] * len(a["gains"]), s=12, alpha=0.45, color=color, zorder=2)
        if a["interval"] is not None:
            lo, hi = a["interval"]
            ax.plot([lo, hi], [y, y], color=color, marker="|", markersize=8, zorder=3)  # drawn as given
        ax.scatter([a["mean"]], [y], marker="s", s=25, color=color, zorder=4)
    ax.axvline(0, color="black", linewidth=0.8)
    if target is not None:
        ax.axvline(target, color="tab:red", linestyle=":", linewidth=1, label=f"target +{target:g} points")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(len(arms)))
    ax.set_yticklabels([a["label"] for a in reversed(arms)], fontsize=7)
    ax.set_xlabel("gain in greedy valid % over the warm start, points\n(dots: seeds; square: mean with its 95 % two-way "
                  "bootstrap interval over seeds and instances)")
    ax.set_title("GRPO stage gains (green: interval above 0)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # long labels kept whole
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m evals.bench.plot_learning", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", metavar="JSON", help="bench_learning --json or --pool files, or ARCHIVE:MEMBER "
                   "(a pattern names every member it matches) of a results folder's answers.tar.xz")
    p.add_argument("--exclude", action="append", default=[], metavar="TEXT",
                   help="leave out every file whose name contains TEXT (repeatable), e.g. _seed for single seeds")
    p.add_argument("--out", type=Path, required=True, help="the figure to write (.png, .svg or .pdf)")
    p.add_argument("--target", type=float, default=5.0, help="gain in points to mark (default 5; negative: none)")
    args = p.parse_args(argv)
    if args.out.suffix.lower() not in (".png", ".svg", ".pdf"):
        p.error(f"--out {args.out}: allowed suffixes: .png, .svg, .pdf")
    try:
        files = [f for f in expand(args.files) if not any(x in Path(split_spec(f)[1] or f).name for x in args.exclude)]
        arms = [arm(f) for f in files]
    except (NotAnArm, PackError) as e:
        p.error(str(e))
    write_plot(arms, args.out, None if args.target < 0 else args.target)
    for a in arms:
        iv = "" if a["interval"] is None else f" [{a['interval'][0]:+.1f}, {a['interval'][1]:+.1f}]"
        print(f"{a['mean']:+5.1f}{iv}  {a['label']}")
    print(f"wrote {args.out}")
    return arms


if __name__ == "__main__":
    main()
