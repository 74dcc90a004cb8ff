"""`python -m env.rg --list`: every reasoning-gym dataset with a curriculum, its default levels (a grid or a
ladder, `env.rg_levels`), the cells it drops and why, or why it is unavailable. The first listing draws a few
questions of every cell to check it, and each level's fixed `val` questions to time it against the task's load
budget (several minutes; the outcome is cached), so it prints each dataset as it goes.
"""

from __future__ import annotations

import argparse
import json
import sys


def describe(name: str, make_task) -> dict:
    """One dataset's default levels as the list shows them (`unavailable` where no task can be built);
    `make_task` is `env.rg.RgTask`."""
    from .rg_levels import RgTaskError

    try:
        task = make_task(f"rg:{name}")
    except RgTaskError as e:
        return {"dataset": name, "unavailable": str(e).split(": ", 1)[1].rsplit("; allowed", 1)[0]}
    return {"dataset": name, "kind": task.kind, "grid_cells": task._lv.grid_cells,
            "levels": [lv.label for lv in task.levels], "dropped": task.dropped}


def text(d: dict, full: bool) -> str:
    if "unavailable" in d:
        return f"{d['dataset']}: unavailable: {d['unavailable']}"
    n = len(d["levels"])
    head = (f"{d['dataset']}: {n} level{'s' * (n != 1)}, "
            + ("its full grid" if d["kind"] == "grid" else f"a ladder over its {d['grid_cells']:,}-cell grid"))
    lines = [head]
    if full or d["kind"] == "ladder":
        lines += [f"  {i}: {label}" for i, label in enumerate(d["levels"])]
    lines += [f"  dropped: {note}" for note in d["dropped"]]
    return "\n".join(lines)


def main(argv: list[str] | None, make_task) -> int:
    p = argparse.ArgumentParser(prog="python -m env.rg", description="reasoning-gym datasets as task families "
                                "(TASK=rg:<dataset>): list them with their default levels")
    p.add_argument("--list", action="store_true", help="list every dataset (or those named) with its default levels")
    p.add_argument("datasets", nargs="*", help="only these datasets (default: every one with a curriculum)")
    p.add_argument("--grids", action="store_true", help="print every level of a grid too (default: ladders only)")
    p.add_argument("--json", action="store_true", help="one JSON object a line instead of text")
    a = p.parse_args(argv)
    if not a.list:
        p.print_usage(sys.stderr)
        print("python -m env.rg: error: nothing to do; allowed: --list [DATASET ...]", file=sys.stderr)
        return 2
    from .rg_levels import datasets_with_curriculum

    known = datasets_with_curriculum()
    bad = [n for n in a.datasets if n not in known]
    if bad:
        print(f"python -m env.rg: error: unknown dataset(s) {', '.join(bad)}; allowed: {', '.join(known)}",
              file=sys.stderr)
        return 2
    for name in a.datasets or known:
        d = describe(name, make_task)
        print(json.dumps(d) if a.json else text(d, a.grids), flush=True)
    return 0
