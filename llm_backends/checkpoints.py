"""Checkpoints: the one home of how a policy folder is checked, loaded and saved, and which base a LoRA adapter
sits on. Training (`trainer.stage`, `trainer.sft`), the in-process engine (`llm_backends.local`) and the vLLM
path (`llm_backends.policy`) all read folders through it, so they agree on what a checkpoint is.

A checkpoint is a folder with full weights (`config.json` + safetensors) or a LoRA adapter (`adapter_config.json`
+ `adapter_model.*`), plus the tokenizer; one written by the trainer also holds `trainer_meta.json`
{reward_state, base_model, is_lora, stage facts}. A plain base-model folder has no `trainer_meta.json`.

The base-model rule (`adapter_base`): the base named by `trainer_meta.json`, else the one `adapter_config.json`
names; the two naming different existing folders is an error (the adapter was trained on one of them only). The
named base is resolved like any model name (`llm_backends.models.resolve_model`); when it does not resolve (a
path on the machine that trained it), the caller's fallback is used, and with no fallback it is an error, never
a silent switch to another model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from llm_backends.models import resolve_model

META_FILE = "trainer_meta.json"
ADAPTER_FILE = "adapter_config.json"


class CheckpointError(RuntimeError):
    """A previous checkpoint is missing or unusable; the message names the path and what is wrong."""


def read_meta(path: str | os.PathLike) -> dict | None:
    """`trainer_meta.json` of a checkpoint written by the trainer, or None for a plain base-model folder."""
    f = Path(path) / META_FILE
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: {META_FILE} is unreadable ({e}); re-run that stage") from None


def adapter_config(path: str | os.PathLike) -> dict | None:
    """The LoRA adapter config in `path`, or None for full weights."""
    f = Path(path) / ADAPTER_FILE
    return json.loads(f.read_text()) if f.exists() else None


def is_lora(path: str | os.PathLike, meta: dict | None) -> bool:
    """A LoRA checkpoint: `is_lora` in its `trainer_meta.json`, or (no meta) a bare adapter folder."""
    return bool(meta.get("is_lora")) if meta is not None else (Path(path) / ADAPTER_FILE).exists()


def is_model_dir(path: Path) -> bool:
    """True for a folder transformers/vLLM can load: full weights or a LoRA adapter."""
    return path.is_dir() and ((path / "config.json").exists() or (path / ADAPTER_FILE).exists())


def adapter_base(path: str | os.PathLike, fallback: str | os.PathLike | None = None) -> Path:
    """The base model folder of the LoRA adapter in `path` (the module docstring's rule).

    Raises `CheckpointError` when the meta and the adapter name different existing folders, or when the named
    base does not resolve (or none is named) and no `fallback` is given.
    """
    path = Path(path)
    meta_base = (read_meta(path) or {}).get("base_model")
    peft_base = (adapter_config(path) or {}).get("base_model_name_or_path")
    named = meta_base or peft_base
    if peft_base and Path(peft_base).exists() and Path(peft_base).resolve() != Path(named).resolve():
        # an adapter loaded onto other weights than it was trained on would silently drop training
        raise CheckpointError(
            f"checkpoint {path}: {META_FILE} names base model {named} but {ADAPTER_FILE} names "
            f"{peft_base}; the adapter was trained on one of them only. Re-run the stage that wrote it"
        )
    if named:
        try:
            return resolve_model(named)
        except (ValueError, FileNotFoundError):
            if fallback is None:
                raise CheckpointError(f"checkpoint {path}: its base model {named} does not exist") from None
    if fallback is None:
        raise CheckpointError(f"checkpoint {path}: its adapter names no base model, and none was given")
    return resolve_model(fallback)


def check_checkpoint(path: Path) -> dict | None:
    """Raise `CheckpointError` unless `path` holds a loadable model; return its meta (None: base model)."""
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {path} does not exist; the previous stage did not finish (re-run it, or start a new run)"
        )
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a file; expected a folder with weights and {META_FILE}")
    meta = read_meta(path)
    lora = is_lora(path, meta)
    if lora:
        need = [ADAPTER_FILE]
        weights = list(path.glob("adapter_model.*"))
        what = "adapter_model.safetensors"
    else:
        need = ["config.json"]
        weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
        what = "model weights (*.safetensors)"
    missing = [n for n in need if not (path / n).exists()] + ([] if weights else [what])
    if not any((path / t).exists() for t in ("tokenizer.json", "tokenizer_config.json")):
        missing.append("tokenizer (tokenizer.json)")
    if meta is not None and lora and not meta.get("base_model"):
        missing.append(f"base_model in {META_FILE}")
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is incomplete: missing {', '.join(missing)}; re-run the stage that wrote it"
        )
    for w in weights:
        if w.suffix == ".safetensors":
            try:
                from safetensors import safe_open

                with safe_open(str(w), framework="pt") as fh:
                    fh.keys()
            except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt file
                raise CheckpointError(
                    f"checkpoint {path}: weight file {w.name} is corrupt ({type(e).__name__}: {e}); "
                    "re-run the stage that wrote it"
                ) from None
    return meta


def load_checkpoint(path: str | os.PathLike, *, dtype: str = "float32", trainable: bool = False):
    """Load `(model, tokenizer)` from a full checkpoint, a LoRA checkpoint or a base-model folder.

    A LoRA checkpoint is loaded onto its base model (`adapter_base`, no fallback) as a `peft.PeftModel`
    (trainable when `trainable=True`). Raises `CheckpointError` naming the path and what is missing or
    corrupt; never falls back to another model.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    meta = check_checkpoint(path)
    torch_dtype = getattr(torch, dtype)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        if is_lora(path, meta):
            from peft import PeftModel

            model = AutoModelForCausalLM.from_pretrained(adapter_base(path), dtype=torch_dtype)
            model = PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers/peft raise many types; one clear line matters
        raise CheckpointError(f"checkpoint {path} could not be loaded ({type(e).__name__}: {e})") from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def save_checkpoint(trainer, out: Path, meta: dict) -> Path:
    """Save a trainer's model (or adapter) + tokenizer + meta into `out` atomically (temp folder, then rename)."""
    tmp = out.with_name(out.name + ".tmp")
    main = trainer.is_world_process_zero()
    if main and tmp.exists():
        shutil.rmtree(tmp)
    trainer.accelerator.wait_for_everyone()  # no-op in one process
    # every process calls save_model (DeepSpeed / FSDP gather shards there); only process zero writes files
    trainer.save_model(str(tmp))  # full weights, or the adapter only for a PeftModel; + processing_class
    if main:
        (tmp / "training_args.bin").unlink(missing_ok=True)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    trainer.accelerator.wait_for_everyone()  # other processes return only once the folder is in place
    return out
