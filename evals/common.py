"""Shared machinery of the evals: config files, one loop run per (arm, seed), statistics, tables, plots.

An *arm* is one thing being compared: an engineer (`compare_engineers.py`) or a context variant of one
engineer (`ablate_context.py`). Every arm runs the full loop once per seed as a subprocess of
`python -m graph.run` with its own run folder; the same seed gives every arm the same stage-0 config and
data, and the same preset gives every arm the same budget, so per-seed differences between arms are paired.

Results are computed from per-instance verdict files only: after a pair finishes, its verdict files
(`final/eval.jsonl`, `stage_k/eval.jsonl`, `stage_k/config.json`, `settings.json`) are copied into
`<out>/verdicts/<arm>-s<seed>/`, and every table and plot is rebuilt from that folder alone, so a reader
of the committed results can recompute each number (`--tables-only`).

Stage-0 sharing (`share_stage0`, on by default): stage 0 (apply -> train_stage -> evaluate of the seed's
random stage-0 config) does not depend on the engineer, so it is trained once per seed. The first pair of a
seed to run is the *donor* and runs in full; every later new pair of that seed starts with
`graph.run --stage0-from <donor run folder>`, which copies the donor's finished stage 0 and continues from
summarize_failures with its own engineer. Every arm of a seed then starts its designed stages from the same
stage-0 checkpoint and validation verdicts (a stronger paired design, and one stage-0 training per seed
instead of one per pair). Any run folder of that seed in `runs_dir` that has finished stage 0 with the same
stage-0 settings can be the donor; with none (e.g. the seed's other pairs were run in another sitting and
only their verdicts are kept) the pair runs in full.

Statistics: per seed, the valid / optimal rate of a subset (3, 4 or 5 agents; wait ratio 0.25 / 0.50 /
0.75; all) pools every instance of that subset over all sizes (the paper's "aggregate over sizes"). Over
seeds we report the mean and a two-sided 95% Student-t interval (mean +- t_{0.975, n-1} * sd / sqrt(n)),
and the gap to the baseline arm as the mean of the per-seed paired differences with its own t-interval.
Next to them: where the answers fail (the share of answers by first failing check, `failures.csv`), which
separates arms whose valid rates are all zero, and a note naming the arms of a seed whose final answers are
identical answer for answer (their stages changed nothing the benchmark sees).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

REPO_ROOT = Path(__file__).resolve().parent.parent
CLASSIC_ENGINEERS = ("fixed", "random", "learnability", "threshold")
SIZES = tuple(range(3, 11))
METRICS = ("valid", "optimal")
EXIT_BAD_SETTINGS = 2  # graph.run's status for a refused setting (and argparse's for an unknown flag)
# The paper's columns, always shown (an empty one as "–" with n=0, never dropped silently).
PAPER_SUBSETS = ("agents_3", "agents_4", "agents_5", "wait_0.25", "wait_0.50", "wait_0.75", "all")


class EvalConfigError(ValueError):
    """A bad eval config: one line naming the file, the field, the value and what is allowed."""


# ----------------------------------------------------------------------------- config files


class LoopConfig(BaseModel):
    """Fields every loop eval (compare, ablate) shares. Paths are relative to the repository root."""

    model_config = ConfigDict(extra="forbid")

    preset: str = Field("smoke", description="graph.run preset: smoke | cpu | paper (same budget for every arm)")
    seeds: list[int] = Field(description="seeds; each gives every arm the same stage-0 config and data")
    out: Path = Field(description="folder of the tables, plots, logs and copied verdict files")
    runs_dir: Path | None = Field(None, description="parent of the run folders (default: runs/evals/<out name>)")
    baseline: str | None = Field(None, description="arm that gaps are measured against (None: no gap columns)")
    set: dict[str, Any] = Field(
        default_factory=dict, description="settings passed identically to every run as --set KEY=VALUE"
    )
    timeout_s: float | None = Field(None, gt=0, description="wall-clock limit of one graph.run call (None: none)")
    share_stage0: bool = Field(
        True, description="train each seed's engineer-independent stage 0 once: the seed's first run is the "
        "donor, later new runs of that seed start with graph.run --stage0-from <donor> (false: every run in full)"
    )

    def resolved_runs_dir(self) -> Path:
        return repo_path(self.runs_dir) if self.runs_dir else REPO_ROOT / "runs" / "evals" / Path(self.out).name

    def resolved_out(self) -> Path:
        return repo_path(self.out)


def repo_path(p: Path | str) -> Path:
    p = Path(p)
    return p if p.is_absolute() else REPO_ROOT / p


def config_command(path: Path) -> str | None:
    """The command in the config's opening comment (`# python -m evals....`), or None."""
    for line in Path(path).read_text().splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            return s.lstrip("#").strip() or None
        return None
    return None


def load_config(path: str | os.PathLike, model: type[BaseModel]) -> BaseModel:
    """Read a YAML (or TOML) eval config into `model`; raise `EvalConfigError` with one readable line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise EvalConfigError(f"cannot read config {path}: {e.strerror}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(text)
        else:
            raw = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one line
        raise EvalConfigError(f"config {path} is not valid {path.suffix[1:] or 'YAML'}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise EvalConfigError(f"config {path}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        known = ", ".join(model.model_fields)
        hint = f"; known fields: {known}" if err["type"] == "extra_forbidden" else ""
        raise EvalConfigError(f"config {path}: field {loc}={err.get('input')!r}: {err['msg']}{hint}") from None


# ----------------------------------------------------------------------------- committed results, reproductions

RESULTS_DIR = REPO_ROOT / "evals" / "results"


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


def retarget(cfg: LoopConfig, out: Path | str | None = None, fresh: bool = False) -> LoopConfig:
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


def retarget_from_args(cfg: LoopConfig, args) -> LoopConfig:
    """`retarget` with the parsed `--out` / `--fresh` flags; `--fresh --tables-only` is refused (no verdicts yet)."""
    if args.fresh and getattr(args, "tables_only", False):
        raise EvalConfigError("--fresh --tables-only: a fresh folder has no verdicts to tabulate; drop --fresh, or "
                              "give --out DIR of an earlier reproduction")
    new = retarget(cfg, out=args.out, fresh=args.fresh)
    if new is not cfg:
        print(f"note: results go to {repo_relative(new.resolved_out())}, run folders to {repo_relative(new.resolved_runs_dir())}",
              file=sys.stderr)
    return new


def guard_committed(pairs: Sequence[Pair], cfg: LoopConfig, env: Mapping[str, str]) -> str | None:
    """Refuse, with one `EvalConfigError` line, to run into a folder of committed results when that would mix
    settings or do nothing; return a note when it continues a committed grid with the same settings.

    - a committed pair (or a finished or partial run folder of a missing one) whose settings differ from what
      this config would start: refused (the results would mix settings);
    - none of this config's pairs committed there (the folder is another config's): refused;
    - every runnable pair already committed: refused (a silent no-op before; nothing would be reproduced);
    - else (same settings, pairs missing): the grid is continued; the committed pairs are kept as they are.
    Not committed: None, nothing checked here (run_grid's usual resume rules).
    """
    out = cfg.resolved_out()
    if not committed(out):
        return None
    how = "pass --fresh (a new folder beside it) or --out DIR to reproduce the config"
    kept, missing = [], []
    for pair in pairs:
        saved = out / "verdicts" / pair.name / "settings.json"
        if saved.is_file():
            drift = settings_drift(pair, cfg.preset, cfg.set, env, saved_path=saved)
            kept.append(pair)
        else:
            drift = settings_drift(pair, cfg.preset, cfg.set, env) if pair.status() in ("finished", "partial") else []
            if check_api_engineer(pair.arm, env) is None:
                missing.append(pair)
        if drift:
            more = f"; +{len(drift) - 2} more" if len(drift) > 2 else ""
            raise EvalConfigError(
                f"{repo_relative(out)} holds committed results made with other settings than this config's ({pair.name}: "
                f"{'; '.join(drift[:2])}{more}); they are not mixed or overwritten: {how}")
    if not kept:
        others = sorted(d.name for d in (out / "verdicts").glob("*-s*") if d.is_dir())
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        raise EvalConfigError(
            f"{repo_relative(out)} holds committed results of other runs than this config's ({shown or 'no verdicts'}); "
            f"they are not mixed or overwritten: {how}")
    if not missing:
        raise EvalConfigError(
            f"{repo_relative(out)} already holds the committed results of this config ({len(kept)} runs); nothing to run: "
            f"{how}, or --tables-only to rebuild the tables from them")
    return (f"continuing the committed grid in {repo_relative(out)}: {len(kept)} committed run(s) kept as they are, "
            f"{len(missing)} to run with the same settings (--fresh reproduces the whole config instead)")


# ----------------------------------------------------------------------------- arms and pairs


@dataclass(frozen=True)
class Arm:
    """One compared thing: a label for the tables and the graph.run flags that make it."""

    label: str
    engineer: str
    context: str | None = None
    engineer_model: str | None = None
    engineer_base_url: str | None = None
    api_key_env: str | None = None  # variable holding this endpoint's key; its child sees it as ENGINEER_API_KEY

    @property
    def is_api(self) -> bool:
        return self.engineer not in CLASSIC_ENGINEERS and self.engineer not in ("self", "base")


@dataclass(frozen=True)
class Pair:
    """One loop run: an arm with one seed, in its own run folder."""

    arm: Arm
    seed: int
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.arm.label}-s{self.seed}"

    def cli_values(self, preset: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The settings graph.run builds from our flags (same shape as graph.run's own CLI values)."""
        values: dict[str, Any] = {"preset": preset, "engineer": self.arm.engineer, "seed": str(self.seed),
                                  "run_dir": str(self.run_dir)}
        if self.arm.context:
            values["context"] = self.arm.context
        if self.arm.engineer_model:
            values["engineer_model"] = self.arm.engineer_model
        if self.arm.engineer_base_url:
            values["engineer_base_url"] = self.arm.engineer_base_url
        for k, v in overrides.items():
            values[k] = _flag_value(v)
        return values

    def command(self, preset: str, overrides: Mapping[str, Any], resume: bool = False,
                stage0_from: Path | None = None) -> list[str]:
        """The graph.run command: a new run (forking stage 0 from `stage0_from` when given) or `--resume`."""
        if resume:
            return [sys.executable, "-m", "graph.run", "--resume", str(self.run_dir)]
        cmd = [sys.executable, "-m", "graph.run", "--preset", preset, "--engineer", self.arm.engineer,
               "--seed", str(self.seed), "--run-dir", str(self.run_dir)]
        if self.arm.context:
            cmd += ["--context", self.arm.context]
        if self.arm.engineer_model:
            cmd += ["--engineer-model", self.arm.engineer_model]
        if self.arm.engineer_base_url:
            cmd += ["--engineer-base-url", self.arm.engineer_base_url]
        for k, v in overrides.items():
            cmd += ["--set", f"{k}={_flag_value(v)}"]
        if stage0_from is not None:
            cmd += ["--stage0-from", str(stage0_from)]
        return cmd

    def status(self) -> str:
        """`finished` (final/metrics.json and report.md), `partial` (settings.json: resumable), `new`,
        or `blocked` (a non-empty folder that is no run folder)."""
        d = self.run_dir
        if (d / "final" / "metrics.json").is_file() and (d / "report.md").is_file():
            return "finished"
        if (d / "settings.json").is_file():
            return "partial"
        if d.exists() and any(d.iterdir()):
            return "blocked"
        return "new"


def _flag_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def make_pairs(arms: Sequence[Arm], seeds: Sequence[int], runs_dir: Path) -> list[Pair]:
    """Every (arm, seed), seed-major so that a partial grid still has every arm on the first seeds."""
    return [Pair(arm, s, runs_dir / f"{arm.label}-s{s}") for s in seeds for arm in arms]


def short_command(cmd: Sequence[str]) -> str:
    """A command as a person would type it (`python` for this interpreter, paths relative to the repo)."""
    out = []
    for i, c in enumerate(cmd):
        if i == 0 and c == sys.executable:
            out.append("python")
            continue
        try:
            c = str(Path(c).relative_to(REPO_ROOT)) if c.startswith("/") else c
        except ValueError:
            pass
        out.append(c if c and all(ch not in c for ch in " '\"$") else repr(c))
    return " ".join(out)


# ----------------------------------------------------------------------------- checks before any work


def check_api_engineer(arm: Arm, env: Mapping[str, str]) -> str | None:
    """None when the arm's engineer can run here, else the reason it cannot (missing key, unknown name).

    Uses `llm_backends.engineers.check_engineer_env`, the check graph.run itself makes before starting, on the
    environment the arm's child would get (`child_env`). An arm with `api_key_env` needs that variable set.
    """
    if arm.engineer in CLASSIC_ENGINEERS:
        return None
    if arm.api_key_env and not env.get(arm.api_key_env):
        return f"engineer {arm.label!r} needs an API key: set {arm.api_key_env}"
    env = child_env(arm, env)
    if arm.engineer_model:  # the flags graph.run gets, as the variables llm_backends.engineers reads
        env["ENGINEER_MODEL"] = arm.engineer_model
    if arm.engineer_base_url:
        env["ENGINEER_BASE_URL"] = arm.engineer_base_url
    try:
        from llm_backends.engineers import EngineerConfigError, check_engineer_env
    except ImportError:  # llm_backends.engineers not there yet: the minimal key check
        return _fallback_key_check(arm, env) if arm.is_api else None
    try:
        check_engineer_env(arm.engineer, env)
    except EngineerConfigError as e:
        return str(e).splitlines()[0]
    return None


def child_env(arm: Arm, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the arm's graph.run: `env`, with the arm's own key variable (`api_key_env`) as
    ENGINEER_API_KEY, so each custom endpoint gets its own key. Only the child's environment holds it:
    it is never put on a command line, in a log, in timings.json or in a run folder."""
    out = dict(env)
    if arm.api_key_env and env.get(arm.api_key_env):
        out["ENGINEER_API_KEY"] = env[arm.api_key_env]
    return out


def _fallback_key_check(arm: Arm, env: Mapping[str, str]) -> str | None:
    keys = {"openai": ("ENGINEER_API_KEY", "OPENAI_API_KEY"), "gemini": ("ENGINEER_API_KEY", "GEMINI_API_KEY")}
    names = keys.get(arm.engineer, ("ENGINEER_API_KEY",))
    if not any(env.get(k) for k in names):
        return f"engineer {arm.engineer!r} needs an API key: set {' or '.join(names)}"
    if arm.engineer not in keys and not (arm.engineer_base_url or env.get("ENGINEER_BASE_URL")):
        return f"engineer {arm.engineer!r} is a custom endpoint: set ENGINEER_BASE_URL or engineer base_url"
    return None


def check_settings(pair: Pair, preset: str, overrides: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """Build the pair's graph.run settings in-process (no model, no files); the error line or None."""
    from env import list_splits
    from nodes.context import SettingsError, build_settings

    try:
        settings = build_settings(pair.cli_values(preset, overrides), env)
    except SettingsError as e:
        return str(e)
    splits = list_splits()
    for name in ("eval_split", "final_split"):
        if getattr(settings, name) not in splits:
            return f"bad setting {name}={getattr(settings, name)!r}: allowed: {', '.join(splits)}"
    return None


def settings_drift(pair: Pair, preset: str, overrides: Mapping[str, Any], env: Mapping[str, str],
                   saved_path: Path | None = None, keys: Callable[[str], bool] | None = None) -> list[str]:
    """Fields (those `keys` selects, default all) where an existing run's settings.json (default: the run
    folder's) differs from what this config would start."""
    from nodes.context import Settings, build_settings

    try:
        saved = Settings.load(saved_path or pair.run_dir / "settings.json").model_dump(mode="json")
        planned = build_settings(pair.cli_values(preset, overrides), env).model_dump(mode="json")
    except Exception:  # noqa: BLE001 - an unreadable settings.json is reported by graph.run itself
        return []
    diffs = []
    for key in sorted(set(saved) | set(planned)):
        if key in ("run_dir", "run_id", "provenance", "keep_checkpoints"):  # where and under which thread the
            # run lives, what it ran on (issue 20's provenance), what it keeps: not what it computes
            continue
        a, b = saved.get(key), planned.get(key)
        if key == "train" and isinstance(a, dict) and isinstance(b, dict):
            diffs += [(f"train.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
                      if a.get(k) != b.get(k) and k != "report_to"]  # where scalars are logged: not computed
        elif a != b:
            diffs.append((key, a, b))
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in diffs if keys is None or keys(k)]


# ----------------------------------------------------------------------------- stage-0 sharing


def stage0_setting(key: str) -> bool:
    """Whether a donor must have the same value of setting `key` (`train.<name>` for training ones): every
    setting outside graph/stage0.py's MAY_DIFFER (the engineer side, the context, the run's bookkeeping),
    the list graph.run itself checks a donor against. Imported here, not at the top, so that loading the
    evals (--help, --tables-only) does not load the settings module."""
    from graph.stage0 import MAY_DIFFER

    return key not in MAY_DIFFER and key.split(".", 1)[0] not in MAY_DIFFER


def stage0_finished(run_dir: Path) -> bool:
    """Whether a run folder is past stage 0's evaluate, by files that only later nodes write: stage 0's
    verdicts plus stage_0/summary.md (summarize_failures), a stage_1/ folder, or final/. Arm-agnostic: any
    engineer's run can be a donor. (graph.run --stage0-from checks the donor's graph.sqlite itself.)"""
    d = Path(run_dir)
    if not (d / "settings.json").is_file() or not (d / "stage_0" / "eval.jsonl").is_file():
        return False
    return (d / "stage_0" / "summary.md").is_file() or (d / "stage_1").is_dir() or (d / "final").is_dir()


def donor_candidates(pair: Pair, pairs: Sequence[Pair], runs_dirs: Iterable[Path]) -> list[Path]:
    """Folders that may give `pair` its stage 0, best first: the grid's pairs of the same seed in run order
    (the first one is the seed's donor), then any other `*-s<seed>` run folder in the runs folders."""
    out = [p.run_dir for p in pairs if p.seed == pair.seed and p.run_dir != pair.run_dir]
    for d in runs_dirs:
        if d.is_dir():
            out += sorted(c for c in d.glob(f"*-s{pair.seed}") if c.is_dir() and c not in out and c != pair.run_dir)
    return out


def stage0_donor(folder: Path) -> str | None:
    """The donor a run (or its collected verdicts) took stage 0 from (its `stage0_from.json`), or None."""
    info = _read_json(Path(folder) / "stage0_from.json")
    if isinstance(info, dict) and info.get("donor"):
        return repo_relative(Path(str(info["donor"])))
    return None


def find_donor(pair: Pair, candidates: Iterable[Path], preset: str, overrides: Mapping[str, Any],
               env: Mapping[str, str]) -> Path | None:
    """The first candidate that has finished stage 0 with this pair's stage-0 settings, or None. Runs that
    trained their own stage 0 come before runs that forked it (the same stage 0, one copy fewer)."""
    from nodes.context import build_settings

    try:
        if build_settings(pair.cli_values(preset, overrides), env).stages < 2:
            return None  # nothing to share: stage 0 is the whole run's training
    except Exception:  # noqa: BLE001 - bad settings are reported by check_settings
        return None
    ok = [c for c in candidates if stage0_finished(c) and not settings_drift(
        pair, preset, overrides, env, saved_path=c / "settings.json", keys=stage0_setting)]
    own = [c for c in ok if not (c / "stage0_from.json").is_file()]
    return (own or ok or [None])[0]


# ----------------------------------------------------------------------------- running the grid


class EventLog:
    """Progress lines for people (stderr, through tqdm when a bar is shown) and `<out>/events.log`."""

    def __init__(self, path: Path | None, write: Callable[[str], None] | None = None):
        self.path = path
        self._write = write or (lambda s: print(s, file=sys.stderr, flush=True))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, line: str) -> None:
        self._write(line)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


@dataclass
class GridResult:
    ran: list[str] = field(default_factory=list)  # pairs for which a graph.run subprocess was started
    skipped: dict[str, str] = field(default_factory=dict)  # pair or arm -> reason (visible, never silent)
    failed: dict[str, str] = field(default_factory=dict)
    finished: list[Pair] = field(default_factory=list)


def run_grid(
    pairs: Sequence[Pair],
    *,
    preset: str,
    overrides: Mapping[str, Any],
    out: Path,
    dry_run: bool = False,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    share_stage0: bool = False,
) -> GridResult:
    """Check everything, then run every pair that is not finished (sequentially; resume partial ones).

    Arms whose API engineer cannot run (no key) are skipped with a line; a pair whose settings are bad
    is reported and left out, before anything expensive starts. With `share_stage0`, a new pair starts
    from the stage 0 of a donor run of its seed (`find_donor`, checked just before it starts) and runs in
    full when there is none. Per-pair wall times, the machine and the stage-0 donor go to
    `<out>/timings.json`; each child's output to `<out>/logs/<pair>.log`.
    """
    from tqdm import tqdm

    env = dict(os.environ if env is None else env)
    log = EventLog(None if dry_run else out / "events.log", write=lambda s: tqdm.write(s, file=sys.stderr))
    result = GridResult()
    todo: list[tuple[Pair, bool]] = []
    arm_reason: dict[str, str | None] = {}
    for pair in pairs:
        if pair.arm.label not in arm_reason:
            arm_reason[pair.arm.label] = check_api_engineer(pair.arm, env)
            if arm_reason[pair.arm.label]:
                log(f"[skip] engineer {pair.arm.label}: {arm_reason[pair.arm.label]} -- all its seeds are left out")
                result.skipped[pair.arm.label] = arm_reason[pair.arm.label]
        if arm_reason[pair.arm.label]:
            continue
        status = pair.status()
        kept = out / "verdicts" / pair.name
        if status == "new" and (kept / "final" / "eval.jsonl").is_file():
            # finished on another day or machine: its run folder is gone, its committed verdicts remain
            drift = settings_drift(pair, preset, overrides, env, saved_path=kept / "settings.json")
            note = f" (WARNING: made with other settings: {'; '.join(drift)[:300]})" if drift else ""
            log(f"[skip] {pair.name}: finished earlier, verdicts kept in {kept}, not redone{note}")
            result.finished.append(pair)
            continue
        if status == "finished":
            drift = settings_drift(pair, preset, overrides, env)
            note = f" (WARNING: made with other settings: {'; '.join(drift)[:300]})" if drift else ""
            log(f"[skip] {pair.name}: finished in {pair.run_dir}, not redone{note}")
            result.finished.append(pair)
            continue
        if status == "blocked":
            msg = f"{pair.run_dir} exists, is not empty and holds no settings.json; move it away or change runs_dir"
            log(f"[error] {pair.name}: {msg}")
            result.failed[pair.name] = msg
            continue
        if status == "partial":
            drift = settings_drift(pair, preset, overrides, env)
            if drift:
                log(f"[warn] {pair.name}: resuming with the run's saved settings, which differ: {'; '.join(drift)[:300]}")
        else:
            err = check_settings(pair, preset, overrides, env)
            if err:
                log(f"[error] {pair.name}: {err}")
                result.failed[pair.name] = err
                continue
        todo.append((pair, status == "partial"))

    runs_dirs = sorted({p.run_dir.parent for p in pairs})

    def donor_of(pair: Pair) -> Path | None:
        return find_donor(pair, donor_candidates(pair, pairs, runs_dirs), preset, overrides, env)

    planned_donor: dict[int, Pair] = {}  # seed -> the first pair planned to run in full (dry-run display)
    for pair, resume in todo:
        donor = donor_of(pair) if share_stage0 and not resume else None
        cmd = short_command(pair.command(preset, overrides, resume=resume, stage0_from=donor))
        if resume:
            how = "resume"
        elif not share_stage0:
            how = "run"
        elif donor is not None:
            how = f"run, stage 0 from {repo_relative(donor)}"
        elif pair.seed in planned_donor:
            first = planned_donor[pair.seed]
            how = f"run, stage 0 from {first.name} once it has finished stage 0 (adds --stage0-from {repo_relative(first.run_dir)})"
        else:
            how = f"run in full (stage-0 donor of seed {pair.seed})"
        if share_stage0 and donor is None and pair.seed not in planned_donor:
            planned_donor[pair.seed] = pair
        log(f"[plan] {pair.name}: {how}: {cmd}")
    if dry_run:
        log(f"[dry-run] {len(todo)} run(s) planned, {len(result.finished)} finished, "
            f"{len(result.skipped)} arm(s) skipped, {len(result.failed)} bad; nothing was started")
        return result

    timings_path = out / "timings.json"
    timings = _read_json(timings_path) or {}
    here = machine()
    bar = tqdm(todo, desc="runs", unit="run", file=sys.stderr, disable=not todo)
    for pair, resume in bar:
        bar.set_postfix_str(pair.name)
        donor = donor_of(pair) if share_stage0 and not resume else None
        cmd = pair.command(preset, overrides, resume=resume, stage0_from=donor)
        log_path = out / "logs" / f"{pair.name}.log"
        log(f"[start] {pair.name}: {short_command(cmd)}")
        result.ran.append(pair.name)
        penv = child_env(pair.arm, env)
        rc, wall = _run_child(cmd, log_path, pair.name, timeout_s, penv)
        if donor is not None and rc == EXIT_BAD_SETTINGS and pair.status() == "new":
            # graph.run refused the donor (or does not know --stage0-from yet): stage 0 in full instead
            log(f"[warn] {pair.name}: graph.run refused --stage0-from {repo_relative(donor)} (exit {rc}: "
                f"{_last_line(log_path)}); running its stage 0 in full")
            donor = None
            cmd = pair.command(preset, overrides, resume=False)
            log(f"[start] {pair.name}: {short_command(cmd)}")
            rc, wall2 = _run_child(cmd, log_path, pair.name, timeout_s, penv)
            wall += wall2
        t = timings.setdefault(pair.name, {"wall_s": 0.0, "calls": 0})
        t["wall_s"] = round(t["wall_s"] + wall, 1)
        t["calls"] += 1
        t["last_rc"] = rc
        t["machine"] = here  # where this pair ran (the last call's machine when it ran on several)
        if here not in t.setdefault("machines", []):
            t["machines"].append(here)
        t["stage0_from"] = stage0_donor(pair.run_dir) or (repo_relative(donor) if donor is not None else None)
        t["stage0_shared"] = t["stage0_from"] is not None
        timings_path.write_text(json.dumps(timings, indent=2) + "\n")
        if rc == 0 and pair.status() == "finished":
            log(f"[done] {pair.name}: {wall:.0f}s")
            result.finished.append(pair)
            collect_verdicts(pair, out)  # at once, so an interrupted grid keeps every finished pair's table rows
        else:
            msg = f"graph.run exited with {rc} after {wall:.0f}s; see {log_path}"
            log(f"[fail] {pair.name}: {msg}; rerun the same command to resume it")
            result.failed[pair.name] = msg
    return result


def repo_relative(p: Path) -> str:
    """A path relative to the repository when it is inside it (what timings.json and the plan show)."""
    try:
        return str(Path(p).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _run_child(cmd: list[str], log_path: Path, name: str, timeout_s: float | None,
               env: Mapping[str, str]) -> tuple[int, float]:
    """Run one graph.run, appending its output to `log_path` and echoing its `[...]` progress lines."""
    from tqdm import tqdm

    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "a") as logf:
        logf.write(f"\n$ {short_command(cmd)}\n")
        logf.flush()
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                logf.flush()
                if line.startswith("[") or line.startswith("error:") or line.startswith("interrupted"):
                    tqdm.write(f"  {name} {line.rstrip()}", file=sys.stderr)
                if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                    proc.terminate()
                    tqdm.write(f"  {name} timed out after {timeout_s:.0f}s; stopping it", file=sys.stderr)
                    break
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()  # graph.run handles SIGTERM like Ctrl-C: the run stays resumable
            proc.wait()
            raise
    return rc, time.monotonic() - t0


def machine() -> str:
    """One line describing this machine (CPU model, cores, memory, NVIDIA GPUs), for the results' timings;
    `run_grid` records it per pair in timings.json when the pair runs."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            gpus += [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("Model:")]
        except OSError:
            pass
    gpu = f", GPU {' + '.join(gpus)}" if gpus else ""
    return f"{cpu}, {os.cpu_count()} cores{mem}{gpu}, {platform.system()}, Python {platform.python_version()}"


# ----------------------------------------------------------------------------- verdict files


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def stage_numbers(folder: Path) -> list[int]:
    out = []
    for d in folder.glob("stage_*"):
        try:
            out.append(int(d.name.split("_", 1)[1]))
        except ValueError:
            continue
    return sorted(out)


def collect_verdicts(pair: Pair, out: Path) -> Path:
    """Copy a finished pair's verdict files to `<out>/verdicts/<pair>/` (small; no checkpoints); return it."""
    dest = out / "verdicts" / pair.name
    files = ["settings.json", "final/eval.jsonl", "stage0_from.json"]
    for k in stage_numbers(pair.run_dir):
        files += [f"stage_{k}/eval.jsonl", f"stage_{k}/config.json"]
    for rel in files:
        src = pair.run_dir / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            if not (dest / rel).is_file() or (dest / rel).read_bytes() != src.read_bytes():
                shutil.copyfile(src, dest / rel)
    return dest


def verdict_folders(out: Path) -> dict[tuple[str, int], Path]:
    """`(arm label, seed) -> <out>/verdicts/<label>-s<seed>` for every collected pair with a final eval."""
    found = {}
    for d in sorted((out / "verdicts").glob("*-s*")):
        label, _, seed = d.name.rpartition("-s")
        if seed.isdigit() and (d / "final" / "eval.jsonl").is_file():
            found[(label, int(seed))] = d
    return found


# ----------------------------------------------------------------------------- statistics

# two-sided 95% Student-t quantiles t_{0.975, df}; df > 30 uses the Cornish-Fisher expansion below
_T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
         10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199, 17: 2.1098,
         18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639, 25: 2.0595,
         26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423}


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (exact table up to 30)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df in _T975:
        return _T975[df]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% t-interval half-width over seeds; half is None with fewer than 2 values.

    >>> r = mean_ci([0.2, 0.4, 0.6]); round(r["mean"], 3), round(r["half"], 3)
    (0.4, 0.497)
    """
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "half": None, "low": None, "high": None, "sd": None}
    m = statistics.fmean(vals)
    if n < 2:
        return {"n": 1, "mean": m, "half": None, "low": None, "high": None, "sd": None}
    sd = statistics.stdev(vals)
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "half": half, "low": m - half, "high": m + half, "sd": sd}


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (for one model on one split, no seeds)."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def subset_key_agents(row: dict) -> str:
    return f"agents_{int((row.get('tags') or {}).get('agents') or row.get('num_agents') or 2)}"


def subset_key_wait(row: dict) -> str | None:
    w = (row.get("tags") or {}).get("wait")
    return None if w is None else f"wait_{float(w):.2f}"


def subset_counts(rows: Iterable[dict]) -> dict[str, dict[str, int]]:
    """Per subset (`all`, `agents_<a>`, `wait_<w>`, `agents_<a>/wait_<w>`): n, valid, optimal counts,
    pooled over sizes. Plain counting on the verdict rows, so a reader can check it by hand."""
    out: dict[str, dict[str, int]] = {}

    def add(key: str, row: dict) -> None:
        c = out.setdefault(key, {"n": 0, "valid": 0, "optimal": 0})
        c["n"] += 1
        c["valid"] += bool(row.get("valid"))
        c["optimal"] += bool(row.get("valid")) and bool(row.get("optimal"))

    for row in rows:
        a, w = subset_key_agents(row), subset_key_wait(row)
        add("all", row)
        add(a, row)
        if w is not None:
            add(w, row)
            add(f"{a}/{w}", row)
    return out


def subset_order(keys: Iterable[str], paper: bool = False) -> list[str]:
    """Table order of subset keys; `paper` adds the paper's columns (PAPER_SUBSETS) even when empty."""
    keys = set(keys) | (set(PAPER_SUBSETS) if paper else set())
    agents = sorted((k for k in keys if k.startswith("agents_") and "/" not in k), key=lambda k: int(k[7:]))
    waits = sorted((k for k in keys if k.startswith("wait_")), key=lambda k: float(k[5:]))
    cross = sorted((k for k in keys if "/" in k), key=lambda k: (int(k.split("/")[0][7:]), float(k.split("/")[1][5:])))
    return agents + waits + cross + (["all"] if "all" in keys else [])


def summarize(verdicts: Mapping[tuple[str, int], Path], arm_order: Sequence[str], baseline: str | None) -> dict:
    """Per arm and subset: per-seed rates, mean and 95% t-interval, and the paired gap to `baseline`."""
    per_seed: dict[str, dict[int, dict[str, dict[str, int]]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        per_seed.setdefault(label, {})[seed] = subset_counts(read_jsonl(folder / "final" / "eval.jsonl"))
    arms = [a for a in arm_order if a in per_seed] + sorted(a for a in per_seed if a not in arm_order)
    subsets = subset_order((k for seeds in per_seed.values() for c in seeds.values() for k in c), paper=True)
    table: dict[str, Any] = {"arms": arms, "subsets": subsets, "baseline": baseline, "rows": {}}
    for label in arms:
        seeds = per_seed[label]
        row: dict[str, Any] = {"seeds": sorted(seeds)}
        for sub in subsets:
            cell: dict[str, Any] = {}
            for metric in METRICS:
                rates = {s: c[sub][metric] / c[sub]["n"] for s, c in seeds.items() if sub in c and c[sub]["n"]}
                stat = mean_ci(list(rates.values()))
                stat["per_seed"] = {str(s): r for s, r in sorted(rates.items())}
                stat["n_instances"] = {str(s): c[sub]["n"] for s, c in sorted(seeds.items()) if sub in c}
                if baseline and baseline in per_seed and label != baseline:
                    base = per_seed[baseline]
                    diffs = [r - base[s][sub][metric] / base[s][sub]["n"]
                             for s, r in sorted(rates.items()) if s in base and sub in base[s] and base[s][sub]["n"]]
                    stat["gap"] = mean_ci(diffs)
                cell[metric] = stat
            row[sub] = cell
        table["rows"][label] = row
    table["failures"] = failure_shares(verdicts, arms)
    return table


def failure_shares(verdicts: Mapping[tuple[str, int], Path], arm_order: Sequence[str]) -> dict:
    """Where the held-out answers fail: per arm, the share of final-benchmark answers by the first check they
    fail (`valid` when none; the checker's order, env.verify.CHECK_ORDER), as the mean and 95% t-interval
    over seeds. It separates arms whose valid rates are all zero (a policy that now writes every agent's
    path but collides differs from one that still drops agents)."""
    from env.verify import CHECK_ORDER

    per: dict[str, dict[int, dict[str, float]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        rows = read_jsonl(folder / "final" / "eval.jsonl")
        if rows:
            counts = Counter("valid" if r.get("valid") else (r.get("failure") or "unknown") for r in rows)
            per.setdefault(label, {})[seed] = {k: c / len(rows) for k, c in counts.items()}
    seen = {k for seeds in per.values() for shares in seeds.values() for k in shares}
    kinds = ["valid", *(k for k in CHECK_ORDER if k in seen), *sorted(seen - set(CHECK_ORDER) - {"valid"})]
    arms = [a for a in arm_order if a in per] + sorted(a for a in per if a not in arm_order)
    rows: dict[str, Any] = {}
    for a in arms:
        seeds = sorted(per[a])
        rows[a] = {"seeds": seeds}
        for k in kinds:
            stat = mean_ci([per[a][s].get(k, 0.0) for s in seeds])
            stat["per_seed"] = {str(s): per[a][s].get(k, 0.0) for s in seeds}
            rows[a][k] = stat
    return {"kinds": kinds, "arms": arms, "rows": rows}


def identical_answer_notes(verdicts: Mapping[tuple[str, int], Path]) -> list[str]:
    """Arms of one seed whose final benchmark answers are the same, answer for answer (id, text and verdict):
    the stages they designed changed nothing the benchmark sees, so their rows differ only by name."""
    groups: dict[int, dict[tuple[int, str], list[str]]] = {}
    for (label, seed), folder in sorted(verdicts.items()):
        rows = read_jsonl(folder / "final" / "eval.jsonl")
        if not rows:
            continue
        key = json.dumps([[r.get(k) for k in ("id", "text", "valid", "optimal", "failure")] for r in rows])
        groups.setdefault(seed, {}).setdefault((len(rows), key), []).append(label)
    notes = []
    for seed, by_answers in sorted(groups.items()):
        for (n, _), labels in by_answers.items():
            if len(labels) > 1:
                notes.append(f"Identical answers, seed {seed}: {', '.join(labels)} gave the same {n} final benchmark "
                             "answers, text for text: the stages they designed changed nothing the benchmark sees, "
                             "so their rows differ only by name.")
    return notes


# ----------------------------------------------------------------------------- tables


def _cell(stat: Mapping[str, Any] | None, signed: bool = False) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    m = 100 * stat["mean"]
    s = f"{m:+.1f}" if signed else f"{m:.1f}"
    return s + ("" if stat.get("half") is None else f" ± {100 * stat['half']:.1f}")


def subset_title(sub: str) -> str:
    if sub == "all":
        return "all"
    parts = []
    for p in sub.split("/"):
        parts.append(f"{p[7:]} agents" if p.startswith("agents_") else f"wait {p[5:]}")
    return ", ".join(parts)


def table_markdown(table: Mapping[str, Any], *, title: str, command: str | None, arm_header: str = "engineer",
                   notes: Sequence[str] = ()) -> str:
    """The paper-style tables: valid % / optimal % per agent count, per wait subset, and gaps to baseline."""
    arms, subsets, base = table["arms"], table["subsets"], table.get("baseline")
    agents = [s for s in subsets if s.startswith("agents_") and "/" not in s]
    waits = [s for s in subsets if s.startswith("wait_")]
    lines = [f"# {title}", ""]
    if command:
        lines += ["Command:", "", f"    {command}", ""]
    lines += [
        "Valid % / optimal % on the held-out benchmark, pooled over sizes; mean ± half-width of the 95% "
        "Student-t interval over seeds (no interval with one seed). Computed from the per-instance verdict "
        "files in `verdicts/` only.",
        "",
    ]

    def block(cols: list[str], metric_pairs: bool, caption: str) -> None:
        if not cols:
            return
        lines.extend([caption, ""])
        lines.append(f"| {arm_header} | seeds | " + " | ".join(subset_title(c) for c in cols) + " |")
        lines.append("|---|---|" + "---|" * len(cols))
        for a in arms:
            row = table["rows"][a]
            cells = []
            for c in cols:
                cell = row.get(c, {})
                if metric_pairs:
                    cells.append(f"{_cell(cell.get('valid'))} / {_cell(cell.get('optimal'))}")
                else:
                    cells.append(_cell(cell.get("valid")))
            lines.append(f"| {a} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
        lines.append("")

    block(agents + (["all"] if "all" in subsets else []), True, "**Valid % / optimal % per agent count**")
    block(waits, True, "**Valid % / optimal % per wait-ratio subset (all agent counts)**")
    if base and base in table["rows"]:
        cols = agents + waits + (["all"] if "all" in subsets else [])
        lines.append(f"**Gap to `{base}` in percentage points (valid / optimal), mean of per-seed paired "
                     "differences ± 95% t half-width**")
        lines.append("")
        lines.append(f"| {arm_header} | " + " | ".join(subset_title(c) for c in cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for a in arms:
            if a == base:
                continue
            row = table["rows"][a]
            cells = [f"{_cell(row.get(c, {}).get('valid', {}).get('gap'), True)} / "
                     f"{_cell(row.get(c, {}).get('optimal', {}).get('gap'), True)}" for c in cols]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
        lines.append("")
    elif base:
        lines += [f"No gap columns: the baseline `{base}` has no finished run.", ""]
    fails = table.get("failures") or {}
    if fails.get("arms"):
        lines += ["**Where the answers fail: share of held-out answers (%) by the first check they fail** "
                  "(`valid`: none; the checker's order), mean ± 95% t half-width over seeds", ""]
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


def table_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Long form for CSV: one row per (arm, subset, metric)."""
    out = []
    for a in table["arms"]:
        row = table["rows"][a]
        for sub in table["subsets"]:
            for metric in METRICS:
                st = row.get(sub, {}).get(metric)
                if not st:
                    continue
                gap = st.get("gap") or {}
                out.append({
                    "arm": a, "subset": sub, "metric": metric, "n_seeds": st["n"],
                    "mean": st["mean"], "ci95_low": st["low"], "ci95_high": st["high"], "ci95_half": st["half"],
                    "gap_mean": gap.get("mean"), "gap_ci95_half": gap.get("half"),
                    "per_seed": json.dumps(st["per_seed"]),
                })
    return out


def write_tables(table: Mapping[str, Any], out: Path, *, title: str, command: str | None,
                 arm_header: str = "engineer", notes: Sequence[str] = (), extra: Mapping[str, Any] | None = None) -> None:
    """`<out>/table.md`, `table.csv` (long form) and `table.json` (everything, per-seed values included)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table_markdown(table, title=title, command=command, arm_header=arm_header,
                                                 notes=notes))
    rows = table_rows(table)
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["arm"])
        w.writeheader()
        w.writerows(rows)
    fails = table.get("failures") or {}
    if fails.get("arms"):
        with open(out / "failures.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["arm", "failure", "n_seeds", "mean", "ci95_half", "per_seed"])
            w.writeheader()
            for a in fails["arms"]:
                for k in fails["kinds"]:
                    st = fails["rows"][a][k]
                    w.writerow({"arm": a, "failure": k, "n_seeds": st["n"], "mean": st["mean"],
                                "ci95_half": st["half"], "per_seed": json.dumps(st["per_seed"])})
    payload = {"title": title, "command": command, **dict(extra or {}), "table": table}
    (out / "table.json").write_text(json.dumps(payload, indent=2) + "\n")


# ----------------------------------------------------------------------------- plots


def stage_curves(folder: Path) -> dict[int, float]:
    """Validation valid rate per stage, from `stage_k/eval.jsonl` verdict rows."""
    curve = {}
    for k in stage_numbers(folder):
        p = folder / f"stage_{k}" / "eval.jsonl"
        if p.is_file():
            rows = read_jsonl(p)
            if rows:
                curve[k] = sum(bool(r.get("valid")) for r in rows) / len(rows)
    return curve


def stage_allocations(folder: Path) -> dict[int, dict[int, float]]:
    """`stage -> size -> data_ratio` from `stage_k/config.json`."""
    out = {}
    for k in stage_numbers(folder):
        cfg = _read_json(folder / f"stage_{k}" / "config.json")
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
        cfg = _read_json(folder / "stage_0" / "config.json")
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
    """`validation_per_stage.png` (mean ± 95% t over seeds, seeds as faint dots) and `allocation.png`
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
        curves = [stage_curves(f) for (lbl, _), f in sorted(verdicts.items()) if lbl == label]
        stages = sorted({k for c in curves for k in c})
        stats = [mean_ci([c[k] for c in curves if k in c]) for k in stages]
        xs = [k + (i - (len(labels) - 1) / 2) * 0.04 for k in stages]
        ax.errorbar(xs, [100 * s["mean"] for s in stats], yerr=[100 * (s["half"] or 0) for s in stats],
                    marker="o", capsize=3, label=f"{label} (n={len(curves)})")
        for c in curves:
            ax.scatter([k + (i - (len(labels) - 1) / 2) * 0.04 for k in c], [100 * v for v in c.values()],
                       s=8, alpha=0.3, color=ax.lines[-1].get_color())
    ax.set_xlabel("stage (evaluated after training it)")
    ax.set_ylabel("validation valid %")
    ax.set_title("Validation success per stage (mean ± 95% t over seeds)")
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


# ----------------------------------------------------------------------------- one loop eval, end to end


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
    notes: list[str] = []
    grid = GridResult()
    if not tables_only:
        env = dict(os.environ if env is None else env)
        protected = committed(out)
        note = guard_committed(pairs, cfg, env)
        if note:
            print(f"note: {note}", file=sys.stderr)
        grid = run_grid(pairs, preset=cfg.preset, overrides=cfg.set, out=out, dry_run=dry_run,
                        timeout_s=cfg.timeout_s, env=env, share_stage0=cfg.share_stage0)
        if dry_run:
            return 0
        for pair in grid.finished:
            if protected and (out / "verdicts" / pair.name / "final" / "eval.jsonl").is_file():
                continue  # committed verdicts are never overwritten, even by a local run of the same settings
            collect_verdicts(pair, out)
    verdicts = {k: v for k, v in verdict_folders(out).items() if k[0] in labels and k[1] in cfg.seeds}
    for label, reason in grid.skipped.items():
        notes.append(f"`{label}` skipped: {reason}")
    for name, reason in grid.failed.items():
        notes.append(f"`{name}` not finished: {reason}")
    notes += [f"WARNING {m}" for m in stage0_mismatches(verdicts)]
    missing = [p.name for p in pairs if (p.arm.label, p.seed) not in verdicts and p.arm.label not in grid.skipped]
    if missing and tables_only:
        notes.append(f"no verdict files for: {', '.join(missing)}")
    timings = _read_json(out / "timings.json") or {}
    notes += timing_notes(timings, labels, cfg.seeds)
    notes += stage0_notes(verdicts, timings)
    notes += identical_answer_notes(verdicts)
    if not verdicts:
        print(f"no finished runs with verdict files under {out / 'verdicts'}; no table written", file=sys.stderr)
        return 1 if (grid.failed or missing) else 0
    table = summarize(verdicts, labels, cfg.baseline)
    write_tables(table, out, title=title, command=command, arm_header=arm_header, notes=notes,
                 extra={"preset": cfg.preset, "seeds": cfg.seeds, "set": cfg.set, "timings_s": timings,
                        "tables_built_on": machine(),
                        "skipped": grid.skipped, "failed": grid.failed})
    plots = write_plots(verdicts, labels, out, arm_header=arm_header)
    print(f"wrote {out / 'table.md'}, table.csv, failures.csv, table.json" + (f", {', '.join(plots)}" if plots else ""),
          file=sys.stderr)
    print((out / "table.md").read_text())
    return 1 if grid.failed else 0
