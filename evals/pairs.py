"""What an eval runs: arms, one loop run per (arm, seed), the checks made before any of them starts, and
the stage-0 donor each new run may fork from.

An *arm* is one thing being compared: an engineer (`compare_engineers.py`) or a context variant of one
engineer (`ablate_context.py`). Every arm runs the full loop once per seed as a subprocess of
`python -m graph.run` with its own run folder; the same seed gives every arm the same stage-0 config and
data, and the same preset gives every arm the same budget, so per-seed differences between arms are paired.

Stage-0 sharing (`share_stage0`, on by default): stage 0 (apply -> train_stage -> evaluate of the seed's
random stage-0 config) does not depend on the engineer, so it is trained once per seed. The first pair of a
seed to run is the *donor* and runs in full; every later new pair of that seed starts with
`graph.run --stage0-from <donor run folder>`, which copies the donor's finished stage 0 and continues from
summarize_failures with its own engineer (every run that trains its own stage 0 is started with
`keep_checkpoints=all`: a preset's `last`, e.g. smoke's, would delete the stage-0 weights before a later fork
links them). Every arm of a seed then starts its designed stages from the same stage-0 checkpoint and
validation verdicts (a stronger paired design, and one stage-0 training per seed instead of one per pair).
Any run folder of that seed in `runs_dir` that has finished stage 0 with the same
stage-0 settings can be the donor; with none (e.g. the seed's other pairs were run in another sitting and
only their verdicts are kept) the pair runs in full.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.config import REPO_ROOT, EvalConfigError, LoopConfig, repo_relative
from evals.packed import unpacked
from evals.results import committed, read_json
from llm_backends.engineers import CLASSIC_ENGINEERS
from trainer.files import stage_dir

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
                stage0_from: Path | None = None, donor: bool = False) -> list[str]:
        """The graph.run command: a new run (forking stage 0 from `stage0_from` when given) or `--resume`.
        `donor`: a new run that trains its own stage 0 may give it to later forks, so it keeps every stage's
        checkpoint (`--set keep_checkpoints=all`, after the config's overrides so that it wins over them and the
        preset: `keep_checkpoints=last` deletes the stage-0 weights once stage 1 is evaluated, before a fork
        that starts later could link them)."""
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
        if donor and stage0_from is None:
            cmd += ["--set", "keep_checkpoints=all"]
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
    from llm_backends.engineers import EngineerConfigError, check_engineer_env

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


def check_settings(pair: Pair, preset: str, overrides: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """Build the pair's graph.run settings in-process (no model, no files); the error line or None."""
    from env import list_splits
    from graph.settings import SettingsError, build_settings

    try:
        settings = build_settings(pair.cli_values(preset, overrides), env)
    except SettingsError as e:
        return str(e)
    splits = list_splits()
    for name in ("eval_split", "final_split", "final_cpu_split"):
        if getattr(settings, name) is not None and getattr(settings, name) not in splits:
            return f"bad setting {name}={getattr(settings, name)!r}: allowed: {', '.join(splits)}"
    return None


def settings_drift(pair: Pair, preset: str, overrides: Mapping[str, Any], env: Mapping[str, str],
                   saved_path: Path | None = None, keys: Callable[[str], bool] | None = None) -> list[str]:
    """Fields (those `keys` selects, default all) where an existing run's settings.json (default: the run
    folder's) differs from what this config would start."""
    from graph.settings import Settings, build_settings

    try:
        saved = Settings.load(saved_path or pair.run_dir / "settings.json").model_dump(mode="json")
        planned = build_settings(pair.cli_values(preset, overrides), env).model_dump(mode="json")
    except Exception:  # noqa: BLE001 - an unreadable settings.json is reported by graph.run itself
        return []
    diffs = []
    for key in sorted(set(saved) | set(planned)):
        if key in ("run_dir", "run_id", "provenance", "keep_checkpoints"):  # where and under which thread the
            # run lives, what it ran on (its provenance), what it keeps: not what it computes
            continue
        a, b = saved.get(key), planned.get(key)
        if key == "train" and isinstance(a, dict) and isinstance(b, dict):
            diffs += [(f"train.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
                      if a.get(k) != b.get(k) and k != "report_to"]  # where scalars are logged: not computed
        elif a != b:
            diffs.append((key, a, b))
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in diffs if keys is None or keys(k)]


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
    with unpacked(out) as source:  # a committed folder's verdicts are packed in its answers.tar.xz
        return _guard(pairs, cfg, env, out, source)


def _guard(pairs: Sequence[Pair], cfg: LoopConfig, env: Mapping[str, str], out: Path, source: Path) -> str | None:
    """`guard_committed` with the committed verdicts read under `source`."""
    how = "pass --fresh (a new folder beside it) or --out DIR to reproduce the config"
    kept, missing = [], []
    for pair in pairs:
        saved = source / "verdicts" / pair.name / "settings.json"
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
        others = sorted(d.name for d in (source / "verdicts").glob("*-s*") if d.is_dir())
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
    if not (d / "settings.json").is_file() or not (stage_dir(d, 0) / "eval.jsonl").is_file():
        return False
    return (stage_dir(d, 0) / "summary.md").is_file() or stage_dir(d, 1).is_dir() or (d / "final").is_dir()


def stage0_weights_kept(run_dir: Path) -> bool:
    """Whether a run folder still holds stage 0's weights, as graph.run --stage0-from checks a donor
    (`graph.stage0.stage0_weights_kept`): a run on keep_checkpoints=last (the smoke preset's; a fork of the grid)
    deleted them once stage 1's were saved."""
    from graph.stage0 import stage0_weights_kept as kept

    return kept(run_dir)


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
    info = read_json(Path(folder) / "stage0_from.json")
    if isinstance(info, dict) and info.get("donor"):
        return repo_relative(Path(str(info["donor"])))
    return None


def find_donor(pair: Pair, candidates: Iterable[Path], preset: str, overrides: Mapping[str, Any],
               env: Mapping[str, str]) -> Path | None:
    """The first candidate that has finished stage 0 with this pair's stage-0 settings and still holds its
    weights, or None. Runs that trained their own stage 0 come before runs that forked it (the same stage 0,
    one copy fewer)."""
    from graph.settings import build_settings

    try:
        if build_settings(pair.cli_values(preset, overrides), env).stages < 2:
            return None  # nothing to share: stage 0 is the whole run's training
    except Exception:  # noqa: BLE001 - bad settings are reported by check_settings
        return None
    ok = [c for c in candidates if stage0_finished(c) and stage0_weights_kept(c) and not settings_drift(
        pair, preset, overrides, env, saved_path=c / "settings.json", keys=stage0_setting)]
    own = [c for c in ok if not (c / "stage0_from.json").is_file()]
    return (own or ok or [None])[0]
