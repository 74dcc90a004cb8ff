"""Tracking of one loop: one TensorBoard run and, when asked for, one Weights & Biases run per
loop, on one global step across stages.

`train.report_to` (`tensorboard` default, `wandb`, `tensorboard,wandb`, `none`) chooses the targets. The
graph wraps its nodes (`graph.wrappers.tracked`) so that, whoever runs the graph (`python -m graph.run`, the
LangGraph server / Studio), after
- `apply` of stage k: W&B gets stage k's environment config as a table `config/stage_<k>` (MAPF: size, data,
  hole, wait; another task: level, what, share, one row per level of its family);
- `train_stage` of stage k: every `train/*` scalar TRL logged per step (read back from stage_k/tb/, which
  the stage's trainer writes, in its child process) goes to the loop's run at `offset_k + step`, where
  `offset_k` is the number of GRPO steps of the stages before k (their metrics.json `train/steps`);
- `evaluate` of stage k: its `eval/*` numbers at the stage's last global step, and `by_stage/eval/*` at
  step k (TensorBoard; W&B gets a `stage` field on the same row instead, its steps must only grow). At stage 0,
  the cached warm start's own evaluation too, as `start/eval/*` on the same step and `by_stage/eval/*` at step
  -1 (TensorBoard), the policy before any GRPO step;
- `final_evaluate`: the `final/*` numbers at the loop's last global step.

The TensorBoard run is `run_dir/tb/` (the per-stage runs stage_k/tb/ stay where they are). What was
already logged is kept in `run_dir/tb/logged.json`, so a resumed run (or a node re-run after a crash)
never logs a stage twice. A tracking failure is a warning on stderr, never the end of a run. The W&B run's
id is the run's id (resumed in place), its config the settings (with the engineer URL's credentials
masked; no environment variable is read into it).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.files import stage_dir, write_json_atomic

if TYPE_CHECKING:
    from graph.settings import Settings

TB_DIR = "tb"
LOGGED_FILE = "logged.json"
KNOBS = ("data_ratio", "hole_ratio", "wait_ratio")


def targets(report_to: str) -> set[str]:
    return {t for t in str(report_to).split(",") if t and t != "none"}


def _numbers(metrics: dict[str, Any] | None, prefix: str) -> dict[str, float]:
    out = {}
    for k, v in (metrics or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[k if k.startswith(prefix) else f"{prefix}{k}"] = float(v)
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def stage_steps(run_dir: Path, stage: int) -> int:
    """The GRPO steps stage `stage` trained (`train/steps` of its metrics.json): 0 for a stage without any or not
    written yet. A metrics.json that is there but cannot be read raises: every later step would be placed wrong
    (the caller's tracking failure is one warning line)."""
    path = stage_dir(run_dir, stage) / "metrics.json"
    m = _read_json(path)
    if m is None and path.exists():
        raise ValueError(f"{path} cannot be read as a JSON object: the global steps of the stages after it are unknown")
    v = (m or {}).get("train/steps")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def stage_offset(run_dir: Path, stage: int) -> int:
    """Global step before stage `stage`'s first GRPO step: the steps of every earlier stage."""
    return sum(stage_steps(run_dir, j) for j in range(stage))


def stage_train_scalars(folder: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every `train/*` scalar in the stage's own TensorBoard run (stage_k/tb/)."""
    tb = Path(folder) / TB_DIR
    if not tb.is_dir() or not any(tb.glob("events.out.tfevents.*")):
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    out = []
    for tag in acc.Tags().get("scalars", []):
        if tag.startswith("train/"):
            out += [(tag, int(e.step), float(e.value)) for e in acc.Scalars(tag)]
    return sorted(out, key=lambda t: (t[1], t[0]))


def config_rows(config: dict[str, Any], settings: Settings) -> tuple[list[str], list[list[Any]]]:
    """A stage's config as W&B table columns and rows, from the run's family (`LoopFamily.report_levels`):
    MAPF-FrozenLake's knobs per grid size (size, data, hole, wait), or another task's share per level, one row for
    each of the family's levels (level, what, share; a level the config leaves out has share 0), keyed by the level
    as the per-level scalars are (`eval/valid_rate/level_<level>`)."""
    from families import family_of

    family = family_of(settings)
    levels = family.report_levels()
    if family.shape.key == "sizes":
        sizes = config.get("sizes") or {}
        return ["size", "data", "hole", "wait"], [[int(n), *(float((sizes[n] or {}).get(k, 0.0)) for k in KNOBS)]
                                                  for n in sorted(sizes, key=lambda x: int(x))]
    shares = {str(k): v for k, v in (config.get("levels") or {}).items()}
    return ["level", "what", "share"], [[lv["index"], str(lv["label"]), float(shares.get(str(lv["index"]), 0.0))]
                                        for lv in levels]


class LoopTracker:
    """The loop's TensorBoard writer and W&B run, opened lazily (one per run folder and process)."""

    def __init__(self, run_dir: Path, settings: Settings):
        self.run_dir = Path(run_dir)
        self.settings = settings
        self.targets = targets(settings.train.report_to)
        self._tb = None
        self._wandb = None
        self.logged_path = self.run_dir / TB_DIR / LOGGED_FILE

    # ------------------------------------------------------------------ bookkeeping
    def _logged(self) -> set[str]:
        doc = _read_json(self.logged_path) or {}
        return set(doc.get("logged") or [])

    def _mark(self, key: str) -> None:
        done = self._logged() | {key}
        write_json_atomic(self.logged_path, {"logged": sorted(done)})

    # ------------------------------------------------------------------ writers
    def tb(self):
        if self._tb is None and "tensorboard" in self.targets:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / TB_DIR))
        return self._tb

    def wandb(self):
        if self._wandb is None and "wandb" in self.targets:
            import wandb

            from llm_backends.redact import mask_url

            s = self.settings
            config = s.model_copy(update={"engineer_base_url": mask_url(s.engineer_base_url)}).model_dump(mode="json")
            run_id = re.sub(r"[^A-Za-z0-9_-]", "-", s.run_id or self.run_dir.name)[:120]
            import os

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT") or "env-engineer", name=s.run_id or self.run_dir.name, id=run_id,
                                     resume="allow", dir=str(self.run_dir), config=config,
                                     job_type=f"{s.preset}-{s.engineer}", reinit="create_new")
        return self._wandb

    def _scalars(self, values: dict[str, float], step: int, wandb_extra: dict[str, Any] | None = None) -> None:
        if not values:
            return
        w = self.tb()
        if w is not None:
            for k, v in values.items():
                w.add_scalar(k, v, step)
            w.flush()
        run = self.wandb()
        if run is not None:
            run.log({**values, **(wandb_extra or {})}, step=step)

    # ------------------------------------------------------------------ events
    def on_config(self, stage: int, config: dict[str, Any] | None) -> None:
        key = f"config:{stage}"
        if not config or key in self._logged():
            return
        run = self.wandb()
        if run is not None:
            import wandb

            columns, rows = config_rows(config, self.settings)
            table = wandb.Table(columns=columns, data=rows)
            run.log({f"config/stage_{stage}": table, "stage": stage},
                    step=stage_offset(self.run_dir, stage))
        w = self.tb()
        if w is not None:
            w.add_text(f"config/stage_{stage}", "```\n" + json.dumps(config.get("sizes", config), indent=1) + "\n```",
                       stage_offset(self.run_dir, stage))
            w.flush()
        self._mark(key)

    def on_train(self, stage: int, train_metrics: dict[str, Any] | None) -> None:
        key = f"train:{stage}"
        if key in self._logged():
            return
        offset = stage_offset(self.run_dir, stage)
        rows = stage_train_scalars(stage_dir(self.run_dir, stage))
        by_step: dict[int, dict[str, float]] = {}
        for tag, step, value in rows:
            by_step.setdefault(offset + step, {})[tag] = value
        if not by_step:  # no per-step curve (a shared or very short stage): the stage's summary at its end
            end = offset + max(stage_steps(self.run_dir, stage), 1)
            by_step[end] = _numbers(train_metrics, "train/")
        for step in sorted(by_step):
            self._scalars(by_step[step], step, {"stage": stage})
        self._mark(key)

    def on_evaluate(self, stage: int, metrics: dict[str, Any] | None,
                    start_metrics: dict[str, Any] | None = None) -> None:
        key = f"eval:{stage}"
        if key in self._logged():
            return
        values = _numbers(metrics, "eval/")
        start = _numbers({k: v for k, v in (start_metrics or {}).items() if k.startswith("eval/")}, "eval/")
        step = stage_offset(self.run_dir, stage + 1)  # the stage's last global step
        # the warm start (stage 0 only) as start/eval/* on the stage's row: W&B's steps only grow, so it cannot go
        # back to step 0, and both trackers get the same scalars on the same steps
        self._scalars({**values, **{f"start/{k}": v for k, v in start.items()}}, step, {"stage": stage})
        w = self.tb()
        if w is not None:
            for k, v in start.items():  # "stage -1": the policy before stage 0's first GRPO step
                w.add_scalar(f"by_stage/{k}", v, -1)
            for k, v in values.items():
                w.add_scalar(f"by_stage/{k}", v, stage)
            w.flush()
        self._mark(key)

    def on_final(self, final_metrics: dict[str, Any] | None) -> None:
        if "final" in self._logged():
            return
        stages = self.settings.stages
        self._scalars(_numbers(final_metrics, "final/"), stage_offset(self.run_dir, stages), {"stage": stages - 1})
        self._mark("final")
        self.close()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


_TRACKERS: dict[str, LoopTracker] = {}


def tracker(run_dir: Path, settings: Settings) -> LoopTracker | None:
    if not targets(settings.train.report_to):
        return None
    key = str(Path(run_dir).resolve())
    t = _TRACKERS.get(key)
    if t is None or t.settings is not settings:
        if t is not None:
            t.close()
        t = _TRACKERS[key] = LoopTracker(Path(run_dir), settings)
    return t


def close_all() -> None:
    for t in list(_TRACKERS.values()):
        t.close()
    _TRACKERS.clear()


def track(node: str, state: dict[str, Any], update: Any, run_dir: Path, settings: Settings) -> None:
    """Log what `node` just produced (see the module docstring); a failure is one warning line."""
    if not isinstance(update, dict):
        return
    try:
        t = tracker(run_dir, settings)
        if t is None:
            return
        if node == "apply":
            t.on_config(int(update.get("stage", state.get("stage", 0)) or 0), update.get("config"))
        elif node == "train_stage":
            t.on_train(int(state.get("stage", 0) or 0), update.get("train_metrics"))
        elif node == "evaluate":
            t.on_evaluate(int(state.get("stage", 0) or 0), update.get("metrics"), update.get("start_metrics"))
        elif node == "final_evaluate":
            t.on_final(update.get("final_metrics"))
    except Exception as e:  # noqa: BLE001 - tracking never ends a run
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        print(f"[warn] tracking ({settings.train.report_to}) after {node}: {type(e).__name__}: {first}",
              file=sys.stderr, flush=True)
