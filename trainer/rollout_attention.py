"""The GRPO rollout copy's attention on CPU: GQA left to torch's kernel for prefills, and each bf16
decode step computed as two grouped matmuls (`_decode_attention`). Used by `trainer.grpo_trainer.RolloutCopy` only;
the trained model keeps transformers' own attention."""

from __future__ import annotations

import functools

GQA_SDPA = "sdpa_gqa"  # the rollout copy's attention: transformers' sdpa, with GQA left to the kernel on CPU


def _sdpa_gqa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                                is_causal=None, decode_matmul: bool = True, keys_first: bool = True, **kwargs):
    """transformers' sdpa attention, except that on CPU with a padding mask the key/value heads are not repeated.

    transformers repeats the key/value heads (`repeat_kv`, a copy of the whole KV cache per layer and token) unless
    the mask is None, because CUDA's fused kernels need that. torch's CPU kernel takes ``enable_gqa`` with a mask
    and gives the same numbers: SmolLM2 has 9 query heads on 3 KV heads, and a left-padded GRPO batch always has a
    mask. Measured with the rollout shape (8 rows, bf16, 1 thread): decode attention over 600 cached positions
    1.06 -> 0.32 ms per layer, a 450-token prefill 20.4 -> 13.5 ms per layer. Anything else goes to transformers.
    One new token per row in bf16 or fp16 (a decode step) goes to `_decode_attention` instead (unless
    `decode_matmul` is off), with or without a mask; `keys_first=False` is its stop-33 form (the benchmark's
    `rollout-qk` path).
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (query.device.type != "cpu" or dropout or kwargs.get("position_bias") is not None
             or kwargs.get("cache") is not None)
    if decode_matmul and not plain and query.shape[2] == 1 and query.dtype in (torch.bfloat16, torch.float16):
        return _decode_attention(query, key, value, attention_mask, scaling, keys_first), None
    if plain or attention_mask is None or groups <= 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _decode_attention(query, key, value, attention_mask, scaling, keys_first: bool = True):
    """Attention of one new token per row, as two grouped matmuls: [rows, 1, heads, dim], like transformers' sdpa.

    torch's CPU kernel for bf16 (`_scaled_dot_product_flash_attention_for_cpu`) is slow at this shape on a CPU
    without AMX: at 16 rows, 9 query heads on 3 KV heads, 200-330 cached positions, 2 threads on the AMD EPYC Zen 4
    it takes 1.9-2.8 ms per layer and token against 0.20-0.27 ms for the matmuls below, and 0.21-0.31 ms for
    itself in float32; a profile of the rollout copy put it at half of the decode time (`evals/bench/bench_rollout.py`
    times the copy with and without this path: `rollout-flash` and `rollout`). Each KV head's query heads
    (transformers' `repeat_kv` order: query head h reads KV head h // groups) score its keys in one matmul; softmax
    in float32; weights back in the cache's dtype for the values. The mask, if any, is boolean (True = attend) or
    additive, as long as the keys (transformers passes sdpa the mask it built for the cache).
    """
    import torch

    rows, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    # keys times queries, not queries times transposed keys: the keys are a view of the growing cache's buffer
    # (`trainer.grpo_trainer.growing_cache`), whose transpose the bf16 batched matmul first copies whole, and the
    # product is the same (the same sums, so the same numbers). 16 rows, 300 cached positions, 2 threads, Xeon:
    # 1.11 -> 0.75 ms per layer and token for this function. `keys_first=False`: the stop-33 product, for the bench.
    if keys_first:
        scores = torch.matmul(key, q.transpose(-1, -2)).transpose(-1, -2).float()
    else:
        scores = torch.matmul(q, key.transpose(-1, -2)).float()
    scores.mul_(dim ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        mask = attention_mask[..., -1:, :].reshape(attention_mask.shape[0], 1, 1, length)
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.float())
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(weights, value).reshape(rows, heads, 1, dim).transpose(1, 2).contiguous()


def use_gqa_sdpa(model, decode_matmul: bool = True, keys_first: bool = True) -> bool:
    """Switch `model` (an sdpa model) to `_sdpa_gqa_attention_forward`, registered once. False if not sdpa.

    `decode_matmul=False` keeps torch's kernel for decode steps too (the sampler before the decode matmuls; the
    benchmark's `rollout-flash` path); `keys_first=False` scores the decode step as the first decode-matmul sampler did (`rollout-qk`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    name = GQA_SDPA + ("" if keys_first else "_qk") if decode_matmul else GQA_SDPA + "_kernel"
    current = getattr(model.config, "_attn_implementation", None)
    if current != "sdpa" and not str(current).startswith(GQA_SDPA):  # sdpa, or one of the variants above
        return False
    AttentionInterface.register(name, functools.partial(_sdpa_gqa_attention_forward, decode_matmul=decode_matmul,
                                                        keys_first=keys_first))
    if name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(name, sdpa_mask)  # the same masks as sdpa
    model.set_attn_implementation(name)
    return True
