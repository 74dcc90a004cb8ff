"""A two-block random Llama with the embedded model's tokenizer, saved as a model folder: a stand-in policy for
tests whose assertions are about the plumbing around a model (files, resume, bookkeeping), not what it says."""

from __future__ import annotations

from pathlib import Path


def save_tiny_llama(folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """`folder` holding the random model (config.json, safetensors) and the tokenizer of `tokenizer_from`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
