"""Checkpoints within a stage, and resuming a half-trained stage from the last one (GRPO and reward-filtered stages).

With `TrainConfig.save_steps = N > 0` the GRPO trainer saves every N optimiser steps into
`stage_<k>/trl/checkpoint-<step>/` (transformers' own: model or adapter, optimiser, scheduler, RNG states,
trainer state with the step count and log history). `ResumeCallback.on_save` then adds `stage_resume.json`
(the reward's running state and its per-batch history, the stage's identity), written last and atomically:
a checkpoint folder without it is incomplete and never resumed from. Older checkpoints are removed only after
the newer one is complete, so one complete checkpoint exists at any time.

A stage that starts again (after a crash, a kill or SIGTERM, via `python -m graph.run --resume`) finds the
newest complete checkpoint of the *same* stage (same training set, starting checkpoint, seed and training
settings: `stage_key`, which names them relative to the run folder, so a moved or copied run keeps its
checkpoints) and continues from it: the trainer restores weights, optimiser, scheduler, RNG and
skips the batches already trained on; the reward's state and history come from `stage_resume.json`. A
checkpoint of another configuration is removed with a log line, and the stage starts over. The whole `trl/`
folder is removed when the stage finishes (its final checkpoint is `stage_<k>/checkpoint/`).

A reward-filtered stage (`trainer.filtered`) keeps the same layout, one checkpoint per saved round:
`trl/checkpoint-<round>/` holds `model.safetensors` (the weights), `optimizer.pt`, and `filtered_state.pt` (the RNG
states, the round counter, the verified examples not yet trained on, the figures so far), then `stage_resume.json`
last (`save_filtered`, `load_filtered`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MARKER = "stage_resume.json"
FILTERED_STATE = "filtered_state.pt"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


class StageKey(str):
    """A stage's key; `legacy`: the key the same attempt had while keys held absolute paths, still resumed (a
    run half-trained before keys were made relative keeps its in-stage checkpoints where it lies)."""

    legacy: tuple[str, ...] = ()


def stage_key(*, train_path, init_checkpoint, seed: int, cfg, run_dir=None) -> str:
    """What makes two attempts the same stage: an in-stage checkpoint resumes only an attempt with this key.

    The key names what is trained, never where the run lies: the training set by its content (sha256), the
    starting checkpoint by its path relative to the run folder (a base model or the warm-start cache outside
    the run by its own path or id), the seed and the training settings. A run folder moved, copied or renamed
    mid-stage keeps its in-stage checkpoints. `run_dir` defaults to the folder that holds the stage folder of
    `train_path` (`<run>/stage_<k>/train.jsonl`)."""
    keep = cfg.model_dump(mode="json")
    for bookkeeping in ("logging_steps", "log_completions", "save_steps"):
        keep.pop(bookkeeping, None)
    if keep.get("rollout_prepack") is None:  # at its default, the keys of attempts made before the setting existed stay as they were
        keep.pop("rollout_prepack", None)
    if not keep.get("stage_samples"):  # the same for the filtered stage's budget, off
        keep.pop("stage_samples", None)
    if keep.get("filtered_sampler") == "rollout":  # likewise for the filtered stage's sampler at its default
        keep.pop("filtered_sampler", None)
    train = Path(train_path).resolve()
    root = Path(run_dir).resolve() if run_dir is not None else train.parent.parent
    try:
        trained = "sha256:" + hashlib.sha256(train.read_bytes()).hexdigest()
    except OSError:
        trained = _in_run(train, root)
    init = Path(init_checkpoint)
    spec = {"train": trained, "init": _in_run(init.resolve(), root) if init.exists() else str(init_checkpoint),
            "seed": int(seed), "cfg": keep}
    key = StageKey(_digest(spec))
    old = {"train_path": str(train), "init": str(init.resolve()), "seed": int(seed), "cfg": keep}
    key.legacy = (_digest(old),)
    return key


def _in_run(path: Path, root: Path) -> str:
    """`path` relative to the run folder `root` (`run:stage_0/checkpoint`), or absolute outside it."""
    try:
        return "run:" + path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def checkpoints(trl_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `checkpoint-<step>` in `trl_dir`, oldest first."""
    if not Path(trl_dir).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(trl_dir).iterdir() if p.is_dir() and (m := _CKPT.match(p.name))]
    return sorted(found)


def find_resume(trl_dir: Path, key: str) -> tuple[Path, dict] | None:
    """The newest complete in-stage checkpoint of the stage with `key` and its marker; None when there is none.
    Checkpoints of another key are removed (they belong to another configuration of this stage folder)."""
    best = None
    for _step, folder in reversed(checkpoints(trl_dir)):
        try:
            marker = json.loads((folder / MARKER).read_text())
        except (OSError, ValueError):
            continue  # killed while saving: incomplete
        if marker.get("stage_key") not in (key, *getattr(key, "legacy", ())):
            log.warning("in-stage checkpoint %s belongs to another configuration of this stage: removed", folder)
            shutil.rmtree(folder, ignore_errors=True)
            continue
        if best is None and ((folder / "trainer_state.json").is_file() or (folder / FILTERED_STATE).is_file()):
            best = (folder, marker)
    return best


def resume_callback(reward, key: str, main: bool = True):
    """A transformers `TrainerCallback` that completes each in-stage checkpoint with the reward state (see doc)."""
    from transformers import TrainerCallback

    class ResumeCallback(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if not main:
                return control
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not folder.is_dir():
                return control
            _complete(folder, {"stage_key": key, "global_step": int(state.global_step),
                               "reward_state": _state_dump(reward), "history": reward.history})
            log.info("in-stage checkpoint at step %d: %s", state.global_step, folder)
            return control

    return ResumeCallback()


def _complete(folder: Path, marker: dict) -> None:
    """Write `folder`'s marker (last and atomically: now the checkpoint is complete), then remove the older ones."""
    from trainer.files import write_text_atomic

    write_text_atomic(folder / MARKER, json.dumps(marker) + "\n")
    for _step, old in checkpoints(folder.parent):  # only now: a complete checkpoint always exists
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


def filtered_snapshot(state: dict, rng) -> tuple[dict, dict]:
    """A copy of a reward-filtered stage's loop state and its RNG states (the python `rng` of its shuffles, torch's of
    its sampling), taken at a round boundary: what `save_filtered` writes."""
    import torch

    copy = {k: (list(v) if isinstance(v, list) else json.loads(json.dumps(v)) if isinstance(v, dict) else v)
            for k, v in state.items()}
    rngs = {"python": rng.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rngs["cuda"] = torch.cuda.get_rng_state_all()
    return copy, rngs


def save_filtered(trl_dir: Path, key: str, model, opt, state: dict, rngs: dict) -> Path:
    """An in-stage checkpoint of a reward-filtered stage after `state["rounds"]` rounds (see the module docstring)."""
    import torch
    from safetensors.torch import save_model

    folder = Path(trl_dir) / f"checkpoint-{state['rounds']}"
    try:  # this very round saved already (a stop right after a periodic save): keep it, it is complete
        if json.loads((folder / MARKER).read_text()).get("stage_key") == key:
            return folder
    except (OSError, ValueError):
        pass
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_model(model, str(folder / "model.safetensors"))
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save({"state": state, "rngs": rngs}, folder / FILTERED_STATE)
    _complete(folder, {"stage_key": key, "global_step": int(state["steps"]), "round": int(state["rounds"]),
                       "optimizer": "filtered"})
    log.info("in-stage checkpoint after round %d: %s", state["rounds"], folder)
    return folder


def load_filtered(folder: Path, model, opt, rng) -> dict:
    """Put a reward-filtered stage back as `save_filtered` left it in `folder`: the weights, the optimiser, the RNG
    states; return its loop state."""
    import torch
    from safetensors.torch import load_model

    load_model(model, str(Path(folder) / "model.safetensors"))
    opt.load_state_dict(torch.load(Path(folder) / "optimizer.pt", weights_only=True))
    saved = torch.load(Path(folder) / FILTERED_STATE, weights_only=False)  # written by this stage: its RNG states
    rngs = saved["rngs"]
    rng.setstate(rngs["python"])
    torch.set_rng_state(rngs["torch"])
    if "cuda" in rngs and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rngs["cuda"])
    return saved["state"]


def restore_reward(reward, marker: dict[str, Any]) -> None:
    """Put the reward's running state (a task's reward may carry one, MAPF's adaptive length weights) and
    per-batch history back as they were at the checkpoint."""
    if reward.state is not None and marker.get("reward_state") is not None:
        reward.state = type(reward.state).model_validate(marker["reward_state"])
    reward.history = list(marker.get("history") or [])


def _state_dump(reward) -> dict | None:
    return reward.state.model_dump(mode="json") if reward.state is not None else None


def remove(trl_dir: Path) -> None:
    if Path(trl_dir).exists():
        shutil.rmtree(trl_dir, ignore_errors=True)
