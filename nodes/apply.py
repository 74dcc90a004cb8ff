"""Generate a stage's training set from its configuration.

What a config is, how stage 0's is drawn and how a stage's items are generated is the run's family's
(`families/base.py` `LoopFamily`: `first_config`, `next_config`, `trained_config`, `stage_items`); what follows
names MAPF-FrozenLake's, and the stage folder is the same for every family (`stage_files`).

The first apply of a run is recognised by the state having no `train_path` yet (nothing has been
generated): it builds stage `state.get("stage", 0)` from the state's `config` when the caller supplied one
(an initial config), else from `random_config(settings.seed)` (the paper's random stage 0). Every later
apply moves from stage k to k+1 with `state["accepted"]` (what validate_config accepted, projected or kept,
or a person's edit under --approve that passed the same checks), taken as checked: it is not validated again,
and appends stage k's entry `{stage, config, metrics, rationale, decision}` to `history` (the rationale
and decision are those of the proposal made after stage k, i.e. of the change to stage k+1).

The config trained is the one given with its data on sizes above `settings.train.max_train_size` moved onto
the smaller ones (`env.restrict_sizes`; the cpu preset trains 3x3-5x5 only, said on stderr and in the log).
Writes `stage_<k>/config.json` (that EnvConfig dump, `num_instances` = settings.train.instances_per_stage),
`train.jsonl` and `env_stats.json` (the generator's statistics plus the seed and counts). The data seed
is `stage_seed(settings.seed, k)`, so a stage's set is the same bytes whenever it is regenerated; an
existing set with the same config.json and env_stats.json is reused (resume after a crash).

`env.generate` has no progress hook, so generation is bracketed by two lines on stderr (the count before,
the count and seconds after): a large set takes minutes and the run should not look stuck.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from families import family_of
from trainer.files import stage_dir, write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from graph.settings import RunContext
    from graph.state import LoopState


def stage_seed(seed: int, stage: int) -> int:
    """The generator seed of stage `stage`'s training set (a stable hash of the run seed and the stage)."""
    return int(hashlib.sha256(f"train-data:{seed}:{stage}".encode()).hexdigest()[:8], 16)


def stage_files(out_dir: Path, config: dict[str, Any], *, seed: int, n: int,
                produce: Callable[[Path], tuple[int, dict[str, Any]]], what: str = "instances") -> dict[str, Any]:
    """A stage folder's config.json, train.jsonl and env_stats.json, for any task: reused when the same config,
    seed and count wrote them already (resume), else `produce(train_path)` writes the items and returns (how many,
    the generator's figures). config.json is written last: its presence marks a complete stage folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_json = json.dumps(config, indent=2) + "\n"
    cfg_path, data_path, stats_path = out_dir / "config.json", out_dir / "train.jsonl", out_dir / "env_stats.json"
    if data_path.is_file() and stats_path.is_file() and cfg_path.is_file() and cfg_path.read_text() == config_json:
        stats = json.loads(stats_path.read_text())
        if stats.get("seed") == seed and stats.get("n") == n:
            return stats
    where = out_dir.name
    print(f"apply: generating {n} training {what} for {where} (seed {seed}) ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    made, figures = produce(data_path)
    print(f"apply: generated {made} of {n} {what} for {where} in {time.monotonic() - t0:.1f} s", file=sys.stderr,
          flush=True)
    stats = {"seed": seed, "n": n, "generated": made, **_jsonable(figures)}
    write_json_atomic(stats_path, stats, ensure_ascii=True)
    write_text_atomic(cfg_path, config_json)
    return stats


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def apply(state: LoopState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Node: build the training set of the next stage (or of stage 0; see the module docstring for how
    stage 0 is recognised). The run's family (`families/base.py` `LoopFamily`) parses, draws and generates its
    config; the stage folder, the history and the returned keys are the same for every family.

    Returns: stage, config, train_path, history, and the per-proposal keys reset for the next round
    (proposal None, attempts 0, feedback []), plus a log line.
    """
    settings, run_dir = runtime.context.settings, runtime.context.run_dir
    if not state.get("train_path") and not state.get("config") and settings.start_config:
        state = {**state, "config": settings.start_config}  # stage 0's config, as the run's settings give it
    family = family_of(settings)
    n = settings.train.instances_per_stage
    first = not state.get("train_path")
    history = list(state.get("history") or [])
    if first:
        stage = int(state.get("stage") or 0)
        given = state.get("config")
        cfg = family.first_config(given, settings.seed, n)
        how = "initial config" if given else f"random_config(seed={settings.seed})"
    else:
        prev = int(state.get("stage") or 0)
        stage = prev + 1
        cfg = family.next_config(state.get("accepted") or state["config"], n)
        history = [e for e in history if e.get("stage") != prev]
        history.append(
            {
                "stage": prev,
                "config": state.get("config"),
                "metrics": state.get("metrics") or {},
                "rationale": state.get("rationale", ""),
                "decision": state.get("decision"),
            }
        )
        how = state.get("decision") or "accepted"
    seed = stage_seed(settings.seed, stage)
    out_dir = stage_dir(run_dir, stage)
    cfg, restricted = family.trained_config(cfg, n, settings.train.max_train_size)
    if restricted:
        print(f"apply: stage {stage}: {restricted}", file=sys.stderr, flush=True)
    stats = stage_files(out_dir, cfg.model_dump(mode="json"), seed=seed, n=n,
                        produce=lambda path: family.stage_items(cfg, n, seed, path), what=family.item_word)
    return {
        "stage": stage,
        "config": cfg.model_dump(mode="json"),  # what config.json holds
        "train_path": str(out_dir / "train.jsonl"),
        "history": history,
        "proposal": None,
        "attempts": 0,
        "feedback": [],
        "log": [
            f"stage {stage}: generated {stats.get('generated', n)} training {family.item_word} ({how}, seed {seed})"
        ]
        + ([f"stage {stage}: {restricted}"] if restricted else []),
    }
