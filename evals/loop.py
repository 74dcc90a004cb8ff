"""One loop eval, end to end: run (or resume) the grid of pairs, collect their verdict files, write the
tables and plots; and the command line that `compare_engineers` and `ablate_context` share.

See `evals.pairs` for arms, pairs and stage-0 sharing, `evals.results` for where results live and
`evals.stats` for the statistics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.config import EvalConfigError, LoopConfig, LoopConfigT, config_command, load_config
from evals.grid import GridResult, collect_verdicts, run_grid
from evals.packed import PACK, PackError, unpacked
from evals.pairs import Arm, guard_committed, make_pairs, stage0_donor
from evals.plan import PlanError, check_seeds, confirm
from evals.plan import note as plan_note
from evals.plots import stage0_mismatches, write_plots
from evals.results import add_reproduce_flags, committed, read_json, retarget_from_args, verdict_folders
from evals.stats import (
    identical_answer_notes,
    identical_weight_notes,
    read_verdicts,
    summarize,
    summarize_rows,
)
from evals.tables import write_tables
from families import DEFAULT_TASK

PLAN_FILE = "plan.json"  # the confirmed plan of a grid, beside its tables (evals.plan)


def confirm_plan(path: Path, cfg: LoopConfig, labels: Sequence[str], tables_only: bool) -> dict[str, Any]:
    """`evals.plan.confirm` of `path`, and PlanError unless its seeds are the config's and its arm one of `labels`
    (or `all`, every arm of the grid)."""
    if tables_only:
        raise PlanError(f"--plan {path} with --tables-only: a plan is confirmed before a grid runs; allowed: --plan "
                        "when running it (the tables quote the plan.json it wrote)")
    plan = confirm(path)
    check_seeds(plan, list(cfg.seeds))
    if plan["arm"] != "all" and plan["arm"] not in labels:
        raise PlanError(f"--plan {plan['file']}: arm {plan['arm']!r} is not in this grid; allowed: one of "
                        f"{', '.join(labels)}, or all")
    return plan


def timing_notes(timings: Mapping[str, Any], labels: Sequence[str], seeds: Sequence[int]) -> list[str]:
    """'Wall time per run on <machine>: ...' per machine the finished pairs ran on (recorded at run time)."""
    by_machine: dict[str, list[str]] = {}
    for name, t in timings.items():
        label, _, seed = name.rpartition("-s")
        if label not in labels or not seed.isdigit() or int(seed) not in seeds or t.get("last_rc") != 0:
            continue
        where = t.get("machine") or "a machine that was not recorded"
        if len(t.get("machines") or []) > 1:
            where = " and ".join(t["machines"])
        by_machine.setdefault(where, []).append(f"{name} {t['wall_s']:.0f}s")
    return [f"Wall time per run on {m}: {', '.join(times)}." for m, times in by_machine.items()]


def stage0_notes(verdicts: Mapping[tuple[str, int], Path], timings: Mapping[str, Any]) -> list[str]:
    """Which pairs took stage 0 from a donor: from the collected `stage0_from.json` (recomputable from the
    verdict files), else from timings.json."""
    shared = {}
    for (label, seed), folder in sorted(verdicts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        donor = stage0_donor(folder) or (timings.get(f"{label}-s{seed}") or {}).get("stage0_from")
        if donor:
            shared[f"{label}-s{seed}"] = Path(donor).name
    if not shared:
        return []
    pairs = ", ".join(f"{name} from {donor}" for name, donor in shared.items())
    return [f"Stage 0 was trained once per seed and shared (paired design): every arm of a seed starts its "
            f"designed stages from the same stage-0 checkpoint and validation verdicts ({pairs})."]


def run_loop_eval(
    *,
    arms: Sequence[Arm],
    cfg: LoopConfig,
    config_path: Path,
    title: str,
    arm_header: str,
    dry_run: bool,
    tables_only: bool,
    env: Mapping[str, str] | None = None,
    jobs: int = 1,
) -> int:
    """Run (or resume) the grid, collect verdicts, write tables and plots. Returns the exit status."""
    out = cfg.resolved_out()
    command = config_command(config_path)
    if command is None:
        print(f"warning: {config_path} does not open with a comment holding the command that runs it",
              file=sys.stderr)
    pairs = make_pairs(arms, cfg.seeds, cfg.resolved_runs_dir())
    labels = [a.label for a in arms]
    if cfg.baseline and cfg.baseline not in labels:
        raise EvalConfigError(f"config {config_path}: baseline {cfg.baseline!r} is not one of the arms {labels}")
    grid = GridResult()
    if not tables_only:
        env = dict(os.environ if env is None else env)
        protected = committed(out)
        note = guard_committed(pairs, cfg, env)
        if note:
            print(f"note: {note}", file=sys.stderr)
        grid = run_grid(pairs, preset=cfg.preset, overrides=cfg.set, out=out, dry_run=dry_run,
                        timeout_s=cfg.timeout_s, env=env, share_stage0=cfg.share_stage0, jobs=jobs)
        if dry_run:
            return 0
        for pair in grid.finished:
            if protected and (out / "verdicts" / pair.name / "final" / "eval.jsonl").is_file():
                continue  # committed verdicts are never overwritten, even by a local run of the same settings
            collect_verdicts(pair, out)
    with unpacked(out) as source:  # the folder itself, or its answers.tar.xz unpacked for the while
        return _tables(source, out, pairs, cfg, labels, grid, tables_only, title=title, command=command,
                       arm_header=arm_header)


def _tables(source: Path, out: Path, pairs, cfg: LoopConfig, labels: Sequence[str], grid: GridResult,
            tables_only: bool, *, title: str, command: str | None, arm_header: str) -> int:
    """The tables and plots of a loop eval into `out`, from the verdict files under `source`."""
    notes: list[str] = []
    verdicts = {k: v for k, v in verdict_folders(source).items() if k[0] in labels and k[1] in cfg.seeds}
    for label, reason in grid.skipped.items():
        notes.append(f"`{label}` skipped: {reason}")
    for name, reason in grid.failed.items():
        notes.append(f"`{name}` not finished: {reason}")
    notes += [f"WARNING {m}" for m in stage0_mismatches(verdicts)]
    missing = [p.name for p in pairs if (p.arm.label, p.seed) not in verdicts and p.arm.label not in grid.skipped]
    if missing and tables_only:
        notes.append(f"no verdict files for: {', '.join(missing)}")
    timings = read_json(out / "timings.json") or {}
    planned = read_json(out / PLAN_FILE)
    if isinstance(planned, dict) and planned.get("commit"):
        notes.append(plan_note(planned))
    notes += timing_notes(timings, labels, cfg.seeds)
    notes += stage0_notes(verdicts, timings)
    notes += identical_answer_notes(verdicts)
    if not verdicts:
        print(f"no finished runs with verdict files under {out / 'verdicts'} or in {out / PACK}; no table written",
              file=sys.stderr)
        return 1 if (grid.failed or missing) else 0
    write_loop_tables(verdicts, labels, cfg, out, title=title, command=command, arm_header=arm_header, notes=notes,
                      extra={"preset": cfg.preset, "seeds": cfg.seeds, "set": cfg.set, "timings_s": timings,
                             "skipped": grid.skipped, "failed": grid.failed,
                             **({"plan": planned} if isinstance(planned, dict) else {})})
    plots = write_plots(verdicts, labels, out, arm_header=arm_header)
    print(f"wrote {out / 'table.md'}, table.csv, failures.csv, table.json" + (f", {', '.join(plots)}" if plots else ""),
          file=sys.stderr)
    print((out / "table.md").read_text())
    return 1 if grid.failed else 0


def show_published(verdicts: Mapping[tuple[str, int], Path], setting: bool | None) -> bool:
    """Whether the paper's published rows go beneath ours: `setting` when given, else when every pair's
    benchmark was the full `test` split (its collected settings.json), the split the paper's numbers are on."""
    if setting is not None:
        return setting
    settings = [read_json(folder / "settings.json") or {} for folder in verdicts.values()]
    if any(s.get("task", DEFAULT_TASK) != DEFAULT_TASK for s in settings):  # the paper's rows are MAPF-FrozenLake's
        return False
    return {s.get("final_split") for s in settings} == {"test"}


def write_loop_tables(verdicts: Mapping[tuple[str, int], Path], labels: Sequence[str], cfg: LoopConfig, out: Path, *,
                      title: str, command: str | None, arm_header: str, notes: Sequence[str],
                      extra: Mapping[str, Any]) -> None:
    """table.md / table.csv / failures.csv / table.json of a loop eval from its verdict files: the one path
    a run, `--tables-only` and the test that rebuilds the committed tables all take."""
    table = summarize(verdicts, labels, cfg.baseline, criterion=cfg.criterion)
    same_weights = identical_weight_notes(verdicts)  # true of both benchmarks: the final weights are the same
    write_tables(table, out, title=title, command=command, arm_header=arm_header, notes=[*notes, *same_weights],
                 extra=extra, published=show_published(verdicts, cfg.published), caveat=cfg.caveat)
    cpu_rows = read_verdicts(verdicts, "final_cpu")
    if cpu_rows:  # the CPU-scale held-out table, beside the benchmark's (never instead of it): cpu/table.*
        splits = sorted({str((read_json(verdicts[k] / "settings.json") or {}).get("final_cpu_split")) for k in cpu_rows})
        cpu_title = f"{title}: CPU-scale held-out table ({', '.join(splits)})"
        write_tables(summarize_rows(cpu_rows, labels, cfg.baseline, cfg.criterion), out / "cpu", title=cpu_title,
                     command=command, arm_header=arm_header, notes=[
                         "The CPU-scale held-out split (2 and 3 agents on 3x3-5x5), where a small policy is not at 0. "
                         f"It sits beside the paper-protocol table in `{out.name}/table.md`, never instead of it.",
                         *same_weights],
                     extra=extra, published=False, source="`verdicts/*/final_cpu/eval.jsonl`", caveat=cfg.caveat)


def main(argv: list[str] | None, *, prog: str, description: str, model: type[LoopConfigT],
         plan: Callable[[LoopConfigT], tuple[LoopConfigT, Sequence[Arm], str]], arm_header: str) -> int:
    """The command line of a loop eval script (`--config`, `--dry-run`, `--tables-only`, `--fresh`, `--out DIR`).

    A script brings its config `model` (a `LoopConfig` with its arms' fields) and its `plan`, which turns
    the loaded config into the config to run, the arms and the tables' title; `arm_header` heads the arm
    column. A bad config is one `error:` line and exit status 2; Ctrl-C leaves a grid that the same command
    resumes (status 130).
    """
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", required=True, type=Path, help="YAML/TOML config (see evals/configs/)")
    p.add_argument("--dry-run", action="store_true", help="check everything and print the plan; run nothing")
    p.add_argument("--tables-only", action="store_true",
                   help="rebuild tables/plots from <out>/verdicts (or <out>/answers.tar.xz) only")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="graph.run calls at once, each pinned to its own share of the cores with that many OMP "
                        "threads (default 1: one run on every core). On 2 cores, --jobs 2 finishes a grid sooner; "
                        "thread counts change float sums, so a seed's numbers match only runs with the same --jobs")
    p.add_argument("--plan", type=Path, default=None, metavar="FILE",
                   help="a committed plan (YAML or JSON: arm, seeds, success; evals/plan.py): refused unless git has "
                        "it committed without changes and its seeds are the config's; recorded as <out>/plan.json")
    add_reproduce_flags(p)
    args = p.parse_args(argv)
    try:
        cfg, arms, title = plan(retarget_from_args(load_config(args.config, model), args))
        if args.plan is not None:
            confirmed = confirm_plan(args.plan, cfg, [a.label for a in arms], args.tables_only)
            if not args.dry_run:
                out = cfg.resolved_out()
                out.mkdir(parents=True, exist_ok=True)
                (out / PLAN_FILE).write_text(json.dumps(confirmed, indent=2) + "\n")
        return run_loop_eval(arms=arms, cfg=cfg, config_path=args.config, arm_header=arm_header, title=title,
                             dry_run=args.dry_run, tables_only=args.tables_only, jobs=args.jobs)
    except (EvalConfigError, PackError, PlanError, KeyboardInterrupt) as e:
        stopped = isinstance(e, KeyboardInterrupt)
        print("\ninterrupted; rerun the same command to resume" if stopped else f"error: {e}", file=sys.stderr)
        return 130 if stopped else 2
