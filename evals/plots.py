"""The plots of a grid, from its verdict files: validation success per stage and the training-data
allocation each arm chose per stage; and the check that every arm of a seed started from the same stage 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from env.config import SIZES
from evals.intervals import rate_interval
from evals.results import read_json, read_jsonl
from trainer.files import stage_dir, stage_numbers


def stage_answers(folder: Path) -> dict[int, list[tuple[str, bool]]]:
    """Validation [(instance id, valid)] per stage, from `stage_k/eval.jsonl` verdict rows."""
    curve = {}
    for k in stage_numbers(folder):
        p = stage_dir(folder, k) / "eval.jsonl"
        if p.is_file():
            rows = read_jsonl(p)
            if rows:
                curve[k] = [(str(r.get("id", j)), bool(r.get("valid"))) for j, r in enumerate(rows)]
    return curve


def stage_counts(folder: Path) -> dict[int, tuple[int, int]]:
    """Validation (answers, valid answers) per stage, from `stage_k/eval.jsonl` verdict rows."""
    return {k: (len(a), sum(ok for _, ok in a)) for k, a in stage_answers(folder).items()}


def stage_curves(folder: Path) -> dict[int, float]:
    """Validation valid rate per stage, from `stage_k/eval.jsonl` verdict rows."""
    return {k: v / n for k, (n, v) in stage_counts(folder).items()}


def error_bars(stats: list[dict[str, Any]]) -> tuple[list[float], list[list[float]]]:
    """Means (%) and matplotlib's asymmetric yerr [[below], [above]] from interval low/high, so a bar never
    reaches below 0 or above 100 (`evals.intervals`)."""
    means = [100 * s["mean"] for s in stats]
    below = [100 * (s["mean"] - s["low"]) if s.get("low") is not None else 0.0 for s in stats]
    above = [100 * (s["high"] - s["mean"]) if s.get("high") is not None else 0.0 for s in stats]
    return means, [below, above]


def stage_allocations(folder: Path) -> dict[int, dict[int, float]]:
    """`stage -> size -> data_ratio` from `stage_k/config.json`."""
    out = {}
    for k in stage_numbers(folder):
        cfg = read_json(stage_dir(folder, k) / "config.json")
        if isinstance(cfg, dict):
            sizes = cfg.get("sizes", cfg)
            try:
                out[k] = {int(s): float(v["data_ratio"]) for s, v in sizes.items()}
            except (TypeError, KeyError, ValueError):
                continue
    return out


def stage0_mismatches(verdicts: Mapping[tuple[str, int], Path]) -> list[str]:
    """Seeds whose stage-0 config differs between arms (the comparison assumes they are identical)."""
    by_seed: dict[int, dict[str, Any]] = {}
    for (label, seed), folder in verdicts.items():
        cfg = read_json(stage_dir(folder, 0) / "config.json")
        if cfg is not None:
            by_seed.setdefault(seed, {})[label] = cfg
    out = []
    for seed, cfgs in sorted(by_seed.items()):
        ref_label, ref = next(iter(cfgs.items()))
        diff = [lbl for lbl, c in cfgs.items() if c != ref]
        if diff:
            out.append(f"seed {seed}: stage-0 config of {', '.join(diff)} differs from {ref_label}")
    return out


def write_plots(verdicts: Mapping[tuple[str, int], Path], arm_order: Sequence[str], out: Path,
                arm_header: str = "engineer") -> list[str]:
    """`validation_per_stage.png` (mean over seeds with its 95% interval, `evals.intervals`, seeds as faint dots) and `allocation.png`
    (mean data_ratio per size that each arm set for each stage). Returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [a for a in arm_order if any(lbl == a for lbl, _ in verdicts)]
    if not labels:
        return []
    files = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, label in enumerate(labels):
        answers = [stage_answers(f) for (lbl, _), f in sorted(verdicts.items()) if lbl == label]
        counts = [{k: (len(a), sum(ok for _, ok in a)) for k, a in c.items()} for c in answers]
        stages = sorted({k for c in counts for k in c})
        stats = [rate_interval({j: {"all": c[k]} for j, c in enumerate(answers) if k in c}) for k in stages]
        xs = [k + (i - (len(labels) - 1) / 2) * 0.04 for k in stages]
        means, yerr = error_bars(stats)
        ax.errorbar(xs, means, yerr=yerr, marker="o", capsize=3, label=f"{label} (n={len(counts)})")
        for c in counts:
            ax.scatter([k + (i - (len(labels) - 1) / 2) * 0.04 for k in c], [100 * v / n for n, v in c.values()],
                       s=8, alpha=0.3, color=ax.lines[-1].get_color())
    ax.set_xlabel("stage (evaluated after training it)")
    ax.set_ylabel("validation valid %")
    ax.set_title("Validation success per stage (mean over seeds, 95% two-way bootstrap / Wilson interval)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=arm_header)
    fig.tight_layout()
    fig.savefig(out / "validation_per_stage.png", dpi=110)
    plt.close(fig)
    files.append("validation_per_stage.png")

    allocs = {label: [stage_allocations(f) for (lbl, _), f in sorted(verdicts.items()) if lbl == label]
              for label in labels}
    n_stages = max((max(a) + 1 for al in allocs.values() for a in al if a), default=0)
    if n_stages:
        fig, axes = plt.subplots(len(labels), 1, figsize=(8, 1.9 * len(labels) + 0.8), sharex=True, squeeze=False)
        width = 0.8 / n_stages
        for ax, label in zip(axes[:, 0], labels, strict=True):
            for k in range(n_stages):
                means = [statistics.fmean([a[k][s] for a in allocs[label] if k in a and s in a[k]] or [0.0])
                         for s in SIZES]
                ax.bar([s + (k - (n_stages - 1) / 2) * width for s in SIZES], means, width=width,
                       label=f"stage {k}")
            ax.set_ylabel("data ratio")
            ax.set_title(f"{label} (mean over {len(allocs[label])} seed(s))", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        axes[0, 0].legend(fontsize=8, ncol=n_stages)
        axes[-1, 0].set_xticks(list(SIZES))
        axes[-1, 0].set_xlabel("grid size")
        fig.suptitle("Training-data allocation per size chosen for each stage")
        fig.tight_layout()
        fig.savefig(out / "allocation.png", dpi=110)
        plt.close(fig)
        files.append("allocation.png")
    return files
