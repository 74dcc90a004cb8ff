"""Pictures of an instance and its optimal plan: the map as text (`draw`) and as a matplotlib figure
(`plan_figure`, `save_png`), whole or one panel per time step. Used by ``python -m env show``.
"""

from __future__ import annotations

from pathlib import Path

from .instance import Instance


def draw(inst: Instance, t: int | None = None) -> str:
    """The map as text with the legend symbols; with `t`, agents' plan positions at step t as digits."""
    from .prompt import GOAL_SYMBOLS, START_SYMBOLS

    cells = [list(row) for row in inst.grid]
    for i, (r, c) in enumerate(inst.goals):
        cells[r][c] = GOAL_SYMBOLS[i]
    for i, (r, c) in enumerate(inst.starts):
        cells[r][c] = START_SYMBOLS[i]
    if t is not None:
        for i, p in enumerate(inst.plan):
            r, c = p[min(t, len(p) - 1)]
            cells[r][c] = str(i)
    return "\n".join(" ".join(row) for row in cells)


_COLORS = ["tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown"]
STEP_COLUMNS = 4  # panels per row of `show --png --steps`


def _draw_map(ax, inst: Instance, t: int | None = None) -> None:
    """One panel: the terrain, and either the whole plan (t=None) or the agents at step t with their trails."""
    import matplotlib.pyplot as plt

    n = inst.size
    for r, row in enumerate(inst.grid):
        for c, ch in enumerate(row):
            ax.add_patch(plt.Rectangle((c, n - 1 - r), 1, 1, color="#1f3b5a" if ch == "H" else "#dff1fb"))
    for i, p in enumerate(inst.plan):
        shown = p if t is None else p[: min(t, len(p) - 1) + 1]
        xs = [c + 0.5 + 0.06 * (i - 2) for _, c in shown]
        ys = [n - 1 - r + 0.5 + 0.06 * (i - 2) for r, _ in shown]
        gr, gc = inst.goals[i]
        gx, gy = gc + 0.5 + 0.06 * (i - 2), n - 1 - gr + 0.5 + 0.06 * (i - 2)
        if t is None:
            ax.plot(xs, ys, "-o", color=_COLORS[i], ms=3, label=f"agent {i}")
            ax.text(xs[0], ys[0], "S", color=_COLORS[i], ha="center", va="center", weight="bold")
        else:  # the trail so far, the agent now as a numbered disc
            ax.plot(xs, ys, "-", color=_COLORS[i], alpha=0.5, lw=1.5)
            ax.plot(xs[-1], ys[-1], "o", color=_COLORS[i], ms=14, label=f"agent {i}")
            ax.text(xs[-1], ys[-1], str(i), color="white", ha="center", va="center", weight="bold", fontsize=8)
        ax.text(gx, gy, "G", color=_COLORS[i], ha="center", va="center", weight="bold",
                alpha=1.0 if t is None else 0.6)
    ax.set_xlim(0, n)
    ax.set_ylim(0, n)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])


def plan_figure(inst: Instance, steps: bool = False):
    """A matplotlib figure of `inst` and its optimal plan: one panel with the whole plan, or with `steps`
    one panel per time step 0..makespan (agents where the plan puts them at that step, trails behind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = inst.size
    title = f"{inst.id}: cost {inst.optimal_cost}, makespan {inst.makespan}"
    if not steps:
        fig, ax = plt.subplots(figsize=(1 + 0.6 * n, 1 + 0.6 * n))
        _draw_map(ax, inst)
        ax.set_title(title)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
        return fig
    panels = inst.makespan + 1
    cols = min(STEP_COLUMNS, panels)
    rows = -(-panels // cols)
    side = 0.9 + 0.35 * n
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols, side * rows + 0.6), squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= panels:
            fig.delaxes(ax)
            continue
        _draw_map(ax, inst, t=k)
        ax.set_title(f"step {k}", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_png(inst: Instance, path: str, steps: bool = False) -> None:
    """`plan_figure` written to `path` through a temp file, so a failure leaves no partial PNG."""
    import matplotlib.pyplot as plt

    fig = plan_figure(inst, steps=steps)
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, bbox_inches="tight", dpi=100)
    plt.close(fig)
    tmp.replace(path)
