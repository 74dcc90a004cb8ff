"""The GPU check's tiny model and its tokenizer: a random Qwen3 of 2 small layers with the embedded SmolLM2
tokenizer (`--tokenizer DIR`; by default `.gpu_wheels/tokenizer` when it exists, else the embedded model's), the
Qwen3-4B shape the probe builds, and the helpers every section shares (vLLM hidden, a CUDA synchronise)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CARRIED_TOKENIZER = ROOT / ".gpu_wheels" / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")

# Qwen3-4B's shape (its config.json): what the paper preset trains
QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def tiny_shape(vocab_size: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def hide_vllm() -> bool:
    """Make `vllm` unimportable in this process (TRL then never imports it: `importlib.util.find_spec` answers None
    for a module set to None in `sys.modules`). The check runs TRL's transformers path, as on a GPU machine without
    vLLM; where vLLM is installed this also saves its import (over 10 s a process). True if it was importable."""
    import importlib.util

    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    found = importlib.util.find_spec("vllm") is not None
    sys.modules["vllm"] = None  # type: ignore[assignment]
    return found


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def find_tokenizer(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if (CARRIED_TOKENIZER / "tokenizer.json").is_file():
        return CARRIED_TOKENIZER
    from llm_backends.models import resolve_model

    return resolve_model("smollm2-135m")


def save_tokenizer(dest: Path) -> list[str]:
    """Copy the embedded model's tokenizer files to `dest` (what a GPU machine without the GGUF package needs)."""
    src = _embedded_tokenizer()
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
            copied.append(name)
    return copied


def _embedded_tokenizer() -> Path:
    from llm_backends.models import resolve_model

    return resolve_model("smollm2-135m")


def build_tiny_model(folder: Path, tokenizer_dir: Path, seed: int = 0) -> dict:
    """A random Qwen3 model of `tiny_shape`, saved with the tokenizer in `folder` (float32 safetensors)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = Qwen3Config(**tiny_shape(len(tok)), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return {"params": sum(p.numel() for p in model.parameters()), "layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "tokenizer": str(tokenizer_dir)}
