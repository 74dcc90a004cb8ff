"""The run report's plots, from the run folder's figures: `stages.png` (valid and optimal % against stage, the
warm start first, with 95 % intervals, on an axis from 0), `rates.png` (per grid size, only the sizes evaluated)
and `allocation.png` (the engineer's allocation per stage)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from families.metrics import wilson
from trainer.files import write_bytes_atomic


def num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def sizes(config: Any) -> dict[int, dict[str, float]]:
    """A config's `sizes` as {size: {knob: float}}, keeping only well-typed entries."""
    raw = config.get("sizes") if isinstance(config, dict) else None
    out: dict[int, dict[str, float]] = {}
    if not isinstance(raw, dict):
        return out
    for n in sorted(int(k) for k in raw if str(k).strip().isdigit()):
        knobs = raw.get(str(n), raw.get(n))
        if isinstance(knobs, dict):
            out[n] = {k: v for k in ("data_ratio", "hole_ratio", "wait_ratio") if (v := num(knobs.get(k))) is not None}
    return out


def level_rate(metrics: dict[str, Any], kind: str, level: int) -> float | None:
    return num(metrics.get(f"eval/{kind}/level_{level}"))


def evaluated_levels(measured: list[dict], keys: list[int]) -> list[int]:
    """The family's levels (MAPF's grid sizes, a task's levels: `keys`) that any of these evaluations answered (the
    per-level chart's axis)."""
    return [n for n in keys if any(level_rate(m, "valid_rate", n) is not None for m in measured)]


def stage_points(stages: list[dict], start: dict | None, kind: str = "valid_rate") -> list[dict[str, Any]]:
    """One point per evaluation, the warm start first: {label, rate, low, high, n} in %, with the 95 % Wilson
    interval of the rate over the evaluation's answers (a run is one seed: its noise is the answers'), or the
    interval the metrics hold (`eval/<kind>_low`, `_high`: the sampled rate's, over questions and samples)."""
    rows = [("start", start)] if start else []
    rows += [(str(s["stage"]), s["metrics"]) for s in stages]
    points = []
    for label, m in rows:
        rate, n = num(m.get(f"eval/{kind}")), num(m.get("eval/n"))
        if rate is None:
            continue
        lo, hi = wilson(round(rate * n), int(n)) if n else (rate, rate)
        given = num(m.get(f"eval/{kind}_low")), num(m.get(f"eval/{kind}_high"))
        lo, hi = given if None not in given else (lo, hi)
        points.append({"label": label, "rate": 100 * rate, "low": 100 * lo, "high": 100 * hi, "n": n})
    return points


def _plot_stages(plt, stages: list[dict], start: dict | None, run_dir: Path) -> str:
    """`stages.png`: the validation valid and optimal rates against stage (the warm start first), with 95 %
    intervals, on an axis from 0; where the evaluation sampled answers, their mean@k as a third line."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    top = 0.0
    labels = [p["label"] for p in stage_points(stages, start)]
    for kind, name, shift in (("valid_rate", "valid", -0.06), ("optimal_rate", "optimal", 0.06),
                              ("sampled_valid_rate", "sampled valid (mean@k)", 0.0)):
        pts = stage_points(stages, start, kind)
        if not pts:
            continue
        xs = [labels.index(p["label"]) + shift for p in pts]
        ax.errorbar(xs, [p["rate"] for p in pts], yerr=[[p["rate"] - p["low"] for p in pts],
                                                       [p["high"] - p["rate"] for p in pts]],
                    marker="o", capsize=3, label=f"{name} %")
        top = max([top, *(p["high"] for p in pts)])
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("stage (start: the warm start, before any GRPO step)")
    ax.set_ylabel("% of validation answers (95 % interval)")
    ax.set_ylim(0, min(100.0, max(10.0, top * 1.15)))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("validation rates against stage")
    fig.tight_layout()
    save_png(fig, run_dir / "stages.png")
    plt.close(fig)
    return "stages.png"


def plot(data: dict[str, Any], run_dir: Path) -> list[str]:
    """Write the PNG plots; return their file names (relative to run_dir)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in data["stages"] if s["metrics"] and "eval/valid_rate" in s["metrics"]]
    start = data.get("start")
    files = []
    if stages:
        files.append(_plot_stages(plt, stages, start, run_dir))
        measured = [start, *(s["metrics"] for s in stages)] if start else [s["metrics"] for s in stages]
        levels = data.get("levels") if data.get("lever") == "levels" else None
        axis = [lv["index"] for lv in data.get("levels") or []] or _measured_levels(measured)
        evaluated = evaluated_levels(measured, axis)
        word = "level" if levels else "size"
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, kind, title in (
            (axes[0], "valid_rate", "valid rate"),
            (axes[1], "optimal_rate", "optimal rate"),
        ):
            lines = [(start, "warm start", {"color": "0.5", "linestyle": "--"})] if start else []
            lines += [(s["metrics"], f"stage {s['stage']}", {}) for s in stages]
            for metrics, label, style in lines:
                ys = [level_rate(metrics, kind, n) for n in evaluated]
                xs = [n for n, y in zip(evaluated, ys, strict=True) if y is not None]
                ax.plot(xs, [100 * y for y in ys if y is not None], marker="o", label=label, **style)
            ax.set_title(f"validation {title} per {word}")
            ax.set_xlabel("level" if levels else "grid size")
            ax.set_xticks(evaluated)  # only the sizes the evaluation answered
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("%")
        axes[0].legend()
        fig.tight_layout()
        save_png(fig, run_dir / "rates.png")
        plt.close(fig)
        files.append("rates.png")
    shares = [s for s in data["stages"] if data.get("lever") == "levels" and data.get("levels") and isinstance((s["config"] or {}).get("levels"), dict)]
    if shares:
        keys = [lv["index"] for lv in data["levels"]]
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / max(1, len(shares))
        for i, s in enumerate(shares):
            got = {int(k): num(v) or 0.0 for k, v in s["config"]["levels"].items()}
            ax.bar([k + (i - (len(shares) - 1) / 2) * width for k in keys], [got.get(k, 0.0) for k in keys],
                   width=width, label=f"stage {s['stage']}")
        ax.set_xlabel("level")
        ax.set_ylabel("share of the stage's questions")
        ax.set_xticks(keys)
        ax.legend()
        ax.set_title("training allocation per stage")
        fig.tight_layout()
        save_png(fig, run_dir / "allocation.png")
        plt.close(fig)
        files.append("allocation.png")
    configs = [s for s in data["stages"] if sizes(s["config"])]
    if configs:
        grid = sorted({n for s in configs for n in sizes(s["config"])})
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        width = 0.8 / max(1, len(configs))
        for i, s in enumerate(configs):
            knobs = sizes(s["config"])
            for ax, knob in zip(axes, ("data_ratio", "hole_ratio", "wait_ratio"), strict=True):
                ys = [knobs.get(n, {}).get(knob, 0.0) for n in grid]
                ax.bar(
                    [n + (i - (len(configs) - 1) / 2) * width for n in grid],
                    ys,
                    width=width,
                    label=f"stage {s['stage']}",
                )
        for ax, knob in zip(axes, ("data_ratio", "hole_ratio", "wait_ratio"), strict=True):
            ax.set_title(knob)
            ax.set_xlabel("grid size")
            ax.set_xticks(grid)
        axes[0].legend()
        fig.suptitle("environment allocation per stage")
        fig.tight_layout()
        save_png(fig, run_dir / "allocation.png")
        plt.close(fig)
        files.append("allocation.png")
    return files


def _measured_levels(measured: list[dict]) -> list[int]:
    """The levels the metrics name (`eval/valid_rate/level_<level>`), when the family gives none."""
    return sorted({int(k.rsplit("_", 1)[1]) for m in measured for k in m
                   if k.startswith("eval/valid_rate/level_") and k.rsplit("_", 1)[1].isdigit()})


def save_png(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
