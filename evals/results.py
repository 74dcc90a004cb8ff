"""Where an eval's results live: committed folders, reproductions into new ones, and the verdict files that
every number is computed from.

Results are computed from per-instance verdict files only: after a pair finishes, its verdict files
(`final/eval.jsonl`, `stage_k/eval.jsonl`, `stage_k/config.json`, `settings.json`; with each stage's
`validation.json` and `engineer_reply.md` as the record of what the engineer proposed) are copied into
`<out>/verdicts/<arm>-s<seed>/` (`evals.grid.collect_verdicts`), and every table and plot is rebuilt from
that folder alone, so a reader of the committed results can recompute each number (`--tables-only`).
Committed results are never overwritten: `--fresh` or `--out DIR` reproduce a config into another folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from evals.config import REPO_ROOT, EvalConfigError, LoopConfigT, repo_path, repo_relative

RESULTS_DIR = REPO_ROOT / "evals" / "results"


# ----------------------------------------------------------------------------- committed results, reproductions


def committed(folder: Path | str) -> bool:
    """Whether `folder` holds results committed to this repository: git tracks a file under it. Outside a git
    checkout (an unpacked archive, no git) every folder under evals/results/ counts as committed."""
    folder = Path(folder).resolve()
    try:
        folder.relative_to(REPO_ROOT)
    except ValueError:
        return False
    try:
        r = subprocess.run(["git", "ls-files", "-z", "--", str(folder)], cwd=REPO_ROOT, capture_output=True,
                           timeout=60)
        if r.returncode == 0:
            return bool(r.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return folder == RESULTS_DIR.resolve() or RESULTS_DIR.resolve() in folder.parents


def reproduce_folder(base: Path, out: Path | str | None, fresh: bool) -> Path | None:
    """Where a reproduction of a config whose results folder is `base` writes: `out` (`--out DIR`), a new
    `<base>-<UTC YYYYmmdd-HHMMSS>` beside `base` (`--fresh`; never an existing folder), or None (neither)."""
    if out is not None and fresh:
        raise EvalConfigError("--out and --fresh both given: pass one (--fresh picks a new folder beside the "
                              "config's out, --out DIR names it)")
    if fresh:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        new, k = base.with_name(f"{base.name}-{stamp}"), 2
        while new.exists():
            new, k = base.with_name(f"{base.name}-{stamp}-{k}"), k + 1
        return new
    if out is None:
        return None
    new = repo_path(out)
    if new.exists() and not new.is_dir():
        raise EvalConfigError(f"--out {out}: is a file; give a folder for the results")
    return new


def retarget(cfg: LoopConfigT, out: Path | str | None = None, fresh: bool = False) -> LoopConfigT:
    """`cfg` with its results in another folder, to reproduce a config on purpose.

    `out`: that folder. `fresh`: a new folder beside the config's `out`, named `<out>-<UTC YYYYmmdd-HHMMSS>`
    (never an existing one). The run folders move with it, to `<parent of the config's runs_dir>/<new name>`,
    so a reproduction trains every run anew: no finished run or stage-0 donor of the original is reused.
    Neither given: `cfg` unchanged.
    """
    new = reproduce_folder(cfg.resolved_out(), out, fresh)
    if new is None:
        return cfg
    return cfg.model_copy(update={"out": new, "runs_dir": cfg.resolved_runs_dir().parent / new.name})


def add_reproduce_flags(parser) -> None:
    """`--out DIR` and `--fresh` on an eval script's argument parser (see `retarget`)."""
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write tables, logs and verdicts to DIR instead of the config's out (run folders go "
                             "beside the config's, named <DIR name>): reproduce a config without touching its "
                             "committed results")
    parser.add_argument("--fresh", action="store_true",
                        help="reproduce the config into a new timestamped folder beside its out (<out>-<UTC time>), "
                             "with new run folders; committed results are never overwritten")


def retarget_from_args(cfg: LoopConfigT, args) -> LoopConfigT:
    """`retarget` with the parsed `--out` / `--fresh` flags; `--fresh --tables-only` is refused (no verdicts yet)."""
    if args.fresh and getattr(args, "tables_only", False):
        raise EvalConfigError("--fresh --tables-only: a fresh folder has no verdicts to tabulate; drop --fresh, or "
                              "give --out DIR of an earlier reproduction")
    new = retarget(cfg, out=args.out, fresh=args.fresh)
    if new is not cfg:
        print(f"note: results go to {repo_relative(new.resolved_out())}, run folders to {repo_relative(new.resolved_runs_dir())}",
              file=sys.stderr)
    return new


# ----------------------------------------------------------------------------- verdict files


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def verdict_folders(out: Path) -> dict[tuple[str, int], Path]:
    """`(arm label, seed) -> <out>/verdicts/<label>-s<seed>` for every collected pair with a final eval."""
    found = {}
    for d in sorted((out / "verdicts").glob("*-s*")):
        label, _, seed = d.name.rpartition("-s")
        if seed.isdigit() and (d / "final" / "eval.jsonl").is_file():
            found[(label, int(seed))] = d
    return found
