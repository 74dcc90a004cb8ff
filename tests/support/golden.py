"""The golden layer: what the scripted `fixed` engineer's smoke runs produce, pinned in tests/golden/.

The `fixed` engineer is scripted (it proposes the same config every stage, no model involved) and the seed
is fixed, so a run's configs, training sets and counts follow from the code alone. tests/test_golden.py
reads the `fixed-s<seed>` runs of the session's smoke grid (tests/support/smoke_grid.py: no extra training)
and compares them with the files written here. The test never writes them; re-recording is this command:

    python -m tests.support.golden --record                 # runs the fixed arm of the grid (two smoke runs)
    python -m tests.support.golden --record --from DIR      # or reads a finished grid's runs/ folder

Review the resulting `git diff tests/golden/` like code: each change should be one you meant.

Pinned per stage (stage_0 ... stage_{n-1}, then final), only what is the same on every CPU:
- the applied config (config.json) and the engineer's decisions with their proposals (validation.json);
- the data set: env_stats.json and one line per training instance (id, size, agents, optimal cost);
- which instances were evaluated (ids) and the discrete results: counts and valid/optimal rates;
- the trainer's counts (steps, instances, groups, completions; SFT steps and examples).
Not pinned: losses, rewards' float figures and timings (they vary with CPU kernels and load), the answers'
text and token counts (greedy decoding can flip on another CPU), paths and cache fields.
"""

from __future__ import annotations

import argparse
import difflib
import json
import tempfile
from pathlib import Path
from typing import Any

from tests.support.smoke_grid import run_grid

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
SEEDS = (0, 1)  # the smoke grid's seeds (smoke_grid.run_grid); its `fixed-s<seed>` runs are the golden runs
PINNED_METRICS = (
    "eval/n", "eval/valid_rate", "eval/optimal_rate",
    "final/n", "final/valid_rate", "final/optimal_rate",
    "train/steps", "train/instances", "train/groups", "train/completions", "train/prompts_dropped",
    "sft/steps", "sft/examples",
)


def golden_path(seed: int) -> Path:
    return GOLDEN_DIR / f"smoke-fixed-s{seed}.json"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _part(folder: Path) -> dict[str, Any]:
    """The pinned view of one stage folder (or of final/)."""
    part: dict[str, Any] = {}
    if (folder / "config.json").is_file():
        part["config"] = json.loads((folder / "config.json").read_text())
    if (folder / "validation.json").is_file():
        part["decisions"] = [{k: d.get(k) for k in ("attempt", "decision", "proposal")}
                             for d in json.loads((folder / "validation.json").read_text())["decisions"]]
    if (folder / "env_stats.json").is_file():
        part["env_stats"] = json.loads((folder / "env_stats.json").read_text())
    if (folder / "train.jsonl").is_file():
        part["train"] = [f"{r['id']} size={r['size']} agents={len(r['starts'])} cost={r['optimal_cost']}"
                         for r in _rows(folder / "train.jsonl")]
    if (folder / "eval.jsonl").is_file():
        part["evaluated"] = [r["id"] for r in _rows(folder / "eval.jsonl")]
    metrics = json.loads((folder / "metrics.json").read_text())
    part["metrics"] = {k: metrics[k] for k in PINNED_METRICS if k in metrics}
    return part


def extract(run_dir: Path) -> dict[str, Any]:
    """The pinned view of a finished run: one entry per stage folder, then `final`."""
    stages = sorted((p for p in run_dir.glob("stage_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
    return {**{p.name: _part(p) for p in stages}, "final": _part(run_dir / "final")}


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def diff(expected: str, actual: str, name: str) -> str:
    """A unified diff of two pinned documents, empty when they are equal."""
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        f"{name} (pinned)", f"{name} (this run)"))


def record(runs: Path) -> list[Path]:
    """Write the golden files from a grid's runs/ folder (its `fixed-s<seed>` runs)."""
    GOLDEN_DIR.mkdir(exist_ok=True)
    written = []
    for seed in SEEDS:
        path = golden_path(seed)
        path.write_text(dumps(extract(runs / f"fixed-s{seed}")))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.golden", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", required=True, help="rewrite the files in tests/golden/")
    parser.add_argument("--from", dest="runs", type=Path,
                        help="a finished smoke grid's runs/ folder to read instead of running the fixed arm")
    args = parser.parse_args(argv)
    if args.runs is not None:
        written = record(args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
            written = record(run_grid(Path(tmp), engineers="fixed")[0] / "runs")
    for path in written:
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
