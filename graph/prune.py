"""`keep_checkpoints=last`: delete older stages' checkpoint weights once nothing can need them.

A full checkpoint of the embedded model is about 517 MB per stage. With `keep_checkpoints=last`, when stage
k's evaluation starts (so stage k's checkpoint is saved and the state that points to it is committed),
the weight files (`*.safetensors`, `*.bin`, `*.pt`) of every earlier stage's `checkpoint/` are deleted,
except one that is still needed:
- the checkpoint the state goes on from (stage k's: evaluate, the self-engineer, the next stage's training,
  the final evaluation and any resume from here on load only it);
- a checkpoint that a kept one is built on (a LoRA adapter's `base_model` in trainer_meta.json can be an
  earlier stage's full fine-tune).
Config, tokenizer and trainer_meta.json stay (kilobytes), and `stage_<j>/pruned.json` records what was
deleted and why. A run that donates its stage 0 (`--stage0-from`) must keep all: the fork links it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainer.files import stage_dir, write_json_atomic

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def _needed_bases(ckpt: Path) -> set[Path]:
    """Folders `ckpt` loads on top of (trainer_meta.json's base_model, adapter_config.json's base)."""
    out: set[Path] = set()
    for name, key in (("trainer_meta.json", "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            v = json.loads((ckpt / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(v, str) and v:
            try:
                out.add(Path(v).resolve())
            except OSError:
                pass
    return out


def prune_older(run_dir: Path, stage: int, current: str | Path | None) -> list[int]:
    """Delete the weights of stages < `stage` (keep_checkpoints=last); returns the stages pruned."""
    run_dir = Path(run_dir)
    keep = {Path(current).resolve()} if current else set()
    if not keep:
        return []  # no checkpoint to go on from yet: prune nothing
    frontier = list(keep)
    while frontier:  # everything the kept checkpoint stands on, transitively
        for base in _needed_bases(frontier.pop()):
            if base not in keep:
                keep.add(base)
                frontier.append(base)
    pruned = []
    for j in range(stage):
        ckpt = stage_dir(run_dir, j) / "checkpoint"
        if not ckpt.is_dir() or ckpt.resolve() in keep or any(k.is_relative_to(ckpt.resolve()) for k in keep):
            continue
        files = sorted(f for pat in WEIGHT_PATTERNS for f in ckpt.rglob(pat) if f.is_file())
        if not files:
            continue
        freed = 0
        for f in files:
            freed += f.stat().st_size
            f.unlink()
        record: dict[str, Any] = {
            "pruned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "why": f"keep_checkpoints=last: stage {stage}'s checkpoint is saved and the run goes on from it",
            "deleted": [str(f.relative_to(ckpt)) for f in files],
            "bytes_freed": freed,
        }
        write_json_atomic(stage_dir(run_dir, j) / "pruned.json", record)
        pruned.append(j)
    return pruned
