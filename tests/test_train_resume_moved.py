"""In-stage checkpoints survive a move or copy of the run folder: a stage's key names what is trained (the
training set's content, the starting checkpoint relative to the run, the seed, the settings), never where the run
lies, so a run moved or copied mid-stage resumes from its last in-stage checkpoint instead of removing it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from trainer import resume as sr
from trainer.config import TrainConfig


def _run(root: Path) -> Path:
    (root / "stage_0" / "checkpoint").mkdir(parents=True)
    (root / "stage_0" / "checkpoint" / "config.json").write_text("{}")
    (root / "stage_1").mkdir()
    (root / "stage_1" / "train.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    return root


def _key(root: Path, **over) -> str:
    kw = dict(train_path=root / "stage_1" / "train.jsonl", init_checkpoint=root / "stage_0" / "checkpoint",
              seed=3, cfg=TrainConfig())
    return sr.stage_key(**{**kw, **over})


def _save(root: Path, step: int, key: str) -> Path:
    folder = root / "stage_1" / "trl" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    (folder / sr.MARKER).write_text(json.dumps({"stage_key": key, "global_step": step, "reward_state": None,
                                                "history": []}))
    return folder


def test_a_moved_or_copied_run_resumes_from_its_in_stage_checkpoint(tmp_path):
    run = _run(tmp_path / "run")
    _save(run, 5, _key(run))
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(run, copy)
    moved = tmp_path / "moved"
    shutil.move(str(run), moved)
    for where in (copy, moved):
        found = sr.find_resume(where / "stage_1" / "trl", _key(where))
        assert found is not None and found[0] == where / "stage_1" / "trl" / "checkpoint-5", where
        assert found[0].is_dir()  # kept, not removed as another configuration's


def test_the_key_still_names_what_is_trained(tmp_path):
    run = _run(tmp_path / "run")
    k = _key(run)
    assert k == _key(run, cfg=TrainConfig(save_steps=7))
    assert k != _key(run, seed=4) and k != _key(run, cfg=TrainConfig(learning_rate=1e-3))
    other_init = run / "stage_9" / "checkpoint"
    other_init.mkdir(parents=True)
    assert k != _key(run, init_checkpoint=other_init)
    (run / "stage_1" / "train.jsonl").write_text('{"id": "c"}\n')  # another training set at the same path
    assert k != _key(run)


def test_a_checkpoint_keyed_the_old_way_is_resumed_where_it_lies(tmp_path):
    run = _run(tmp_path / "run")
    cfg = TrainConfig().model_dump(mode="json")
    for bookkeeping in ("logging_steps", "log_completions", "save_steps"):
        cfg.pop(bookkeeping)
    if cfg.get("rollout_prepack") is None:
        cfg.pop("rollout_prepack", None)
    for added_since in ("stage_samples", "filtered_sampler"):  # the filtered stage's settings, younger than the key
        cfg.pop(added_since)
    spec = {"train_path": str((run / "stage_1" / "train.jsonl").resolve()),
            "init": str((run / "stage_0" / "checkpoint").resolve()), "seed": 3, "cfg": cfg}
    old_key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    _save(run, 8, old_key)
    found = sr.find_resume(run / "stage_1" / "trl", _key(run))
    assert found is not None and found[1]["global_step"] == 8
