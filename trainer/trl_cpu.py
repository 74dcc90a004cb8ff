"""Four small, tested changes to TRL internals that make its training stages cheaper on CPU.

1. The fused LM head scores only labelled positions (`score_labelled_positions_only`).
2. GRPO scores a batch whose rows share one prompt over a single forward of that prompt
   (`score_with_shared_prompt`).
3. The fused LM head works in tiles that stay in cache (`tile_head_on_cpu`).
4. A stage that generates with transformers imports TRL's GRPO trainer without vLLM (`grpo_trainer_class`).

The first, in detail:

TRL 1.16's fused LM head (`trl.trainer.utils.add_fused_lm_head`, used by `SFTTrainer` and `GRPOTrainer`) projects
only the positions that carry a label on Triton devices (CUDA, XPU). On every other device it projects *every*
position through the 49,152-word head and masks the result afterwards, to keep tile shapes fixed for compilers such
as Neuron's. On CPU nothing is compiled, so that only wastes work: with a 450-token prompt and a 60-token answer,
88 % of the head's work (and about 60 % of an SFT step, measured with the torch profiler) is thrown away.

`score_labelled_positions_only()` makes the head's choice "only the labelled positions" on CPU too. The values are
identical (the same kernel on the same rows; tested in tests/test_learning_setup.py); only the masked rows are skipped.
It is idempotent and changes nothing on CUDA/XPU, where TRL already does this. `ENV_ENGINEER_TRL_PATCH=0` leaves
TRL's head as it is (every position scored, and TRL's own 4096 x 32,768 tiles, whose rounding differs from the CPU
tiles' by about 1e-5): the "before" side of `python -m evals.bench.bench_train --compare` (which also turns the
second change off, `train.share_prompt=false`). Each stage records whether the patches were on
(`trl_cpu_patches` in trainer_meta.json).
"""

from __future__ import annotations

import os
import sys

_PATCHED = False


def score_labelled_positions_only() -> bool:
    """Patch TRL's fused LM head to score only labelled positions on CPU; return whether a patch was applied now."""
    global _PATCHED
    if _PATCHED or os.environ.get("ENV_ENGINEER_TRL_PATCH", "1") == "0":
        return False
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton

    def _compact_on_cpu(device) -> bool:
        # the name TRL reads to decide "score only labelled rows"; its kernels keep their own reference
        return device.type == "cpu" or original(device)

    _compact_on_cpu.original = original  # type: ignore[attr-defined]
    trl_utils._use_triton = _compact_on_cpu
    _PATCHED = True
    return True


CPU_HEAD_ROWS = 512  # token rows per call of TRL's chunked LM head on CPU (TRL's own tile: 4096)
CPU_HEAD_VOCAB = 2048  # vocabulary columns per tile on CPU (TRL's: 32,768)
_TILED = False


class _CpuTiledHead:
    """TRL's `ChunkedLogProbFunction` with CPU-sized tiles: the rows in blocks of `CPU_HEAD_ROWS`, each one call
    with `CPU_HEAD_VOCAB` columns per tile. Rows are independent in TRL's kernel (it loops over row blocks itself),
    so the outputs are the same rows concatenated; only the online log-sum-exp's order of columns changes rounding
    (about 1e-5 on log-probs). Anything not on CPU goes to TRL unchanged."""

    def __init__(self, fn):
        self.original = fn

    def apply(self, hidden, weight, bias, targets, temperature, chunk_size, *rest):
        if hidden.device.type != "cpu" or hidden.shape[0] <= 0:
            return self.original.apply(hidden, weight, bias, targets, temperature, chunk_size, *rest)
        import torch

        parts = [self.original.apply(hidden[i:i + CPU_HEAD_ROWS], weight, bias, targets[i:i + CPU_HEAD_ROWS],
                                     temperature, min(int(chunk_size), CPU_HEAD_VOCAB), *rest)
                 for i in range(0, hidden.shape[0], CPU_HEAD_ROWS)]
        if len(parts) == 1:
            return parts[0]
        return tuple(None if out[0] is None else torch.cat(out) for out in zip(*parts, strict=True))


def tile_head_on_cpu() -> bool:
    """Give TRL's fused LM head CPU-sized tiles (`_CpuTiledHead`); return whether a patch was applied now.

    TRL's torch fallback for devices without Triton folds tiles of 4096 rows x 32,768 columns: 228 MB in float32 at a
    GRPO step's 1,737 rows, and about fifteen elementwise passes over each (scale, exp, entropy, the gradient), all
    from memory. With 512 x 2048 tiles (4 MB) they stay in cache: the fused head's forward and backward at 1,728
    rows take 4.20 s against 7.15 s (1.70x), at SFT's 480 rows 1.19 against 1.80 s, on a 2-core AMD EPYC Zen 3
    (`python -m evals.bench.bench_head`, medians of 3 interleaved rounds). Idempotent;
    `ENV_ENGINEER_TRL_PATCH=0` leaves TRL as shipped, as for the other changes; `ENV_ENGINEER_HEAD_TILES=0` keeps TRL's
    tiles alone (`python -m evals.bench.bench_train --head-tiles`).
    """
    global _TILED
    if _TILED or "0" in (os.environ.get("ENV_ENGINEER_TRL_PATCH", "1"), os.environ.get("ENV_ENGINEER_HEAD_TILES", "1")):
        return False
    import trl.trainer.utils as trl_utils

    trl_utils._ChunkedLogProbFunction = _CpuTiledHead(trl_utils._ChunkedLogProbFunction)
    _TILED = True
    return True


def shared_prompt(model, input_ids, attention_mask, logits_to_keep: int, *, gradient_checkpointing: bool,
                  multimodal: bool, aux_loss: bool) -> tuple[int, int] | None:
    """`(pad, end)` when every row of a GRPO batch holds the same prompt in columns `pad:end` after `pad` columns of
    padding common to all rows; None when the batch must take TRL's own path: not on CPU, one row, a multimodal or
    MoE batch, a PEFT model, gradient checkpointing (no cache there), or rows whose prompts or padding differ."""
    b, t = input_ids.shape
    end = t - int(logits_to_keep)
    if (input_ids.device.type != "cpu" or b < 2 or multimodal or aux_loss or gradient_checkpointing
            or hasattr(model, "peft_config") or not hasattr(model, "base_model")):
        return None
    mask = attention_mask[:, :end]
    if not bool((mask == mask[:1]).all()) or not bool((input_ids[:, :end] == input_ids[:1, :end]).all()):
        return None
    ones = mask[0].nonzero()
    if ones.numel() == 0:
        return None
    pad = int(ones[0])
    if not bool(mask[0, pad:].all()) or end - pad < 2:
        return None
    return pad, end


def score_with_shared_prompt(model, input_ids, attention_mask, logits_to_keep: int, pad: int, autocast,
                             compute_entropy: bool):
    """(log-probs, entropies) of the last `logits_to_keep` tokens of rows that share their prompt (see
    `shared_prompt`), as TRL's `_get_per_token_logps_and_entropies` computes them, with the prompt run once.

    The `pad` leading columns that every row pads are dropped, so the prompt sits at positions 0, 1, ... as it
    did when the completions were sampled (TRL's own path would shift it by the padding). The backbone runs the
    prompt but its last token once (`use_cache=True`); its keys and values are repeated for every row; then each
    row runs its last prompt token and its completion over them, and TRL's fused head scores the completion tokens.
    Gradients flow back through the repeated keys and values into the one prompt forward, so the loss and its
    gradient are the full batch's. With 16 completions of about 80 tokens to a 200-token prompt this runs 1,480
    token positions instead of 4,480.
    """
    input_ids, attention_mask = input_ids[:, pad:], attention_mask[:, pad:]
    p = input_ids.size(1) - int(logits_to_keep)
    with autocast():
        prompt = model.base_model(input_ids=input_ids[:1, : p - 1], attention_mask=attention_mask[:1, : p - 1],
                                  use_cache=True)
        cache = prompt.past_key_values
        cache.batch_repeat_interleave(input_ids.size(0))
        rest = input_ids[:, p - 1:]
        labels = rest.masked_fill(attention_mask[:, p - 1:] == 0, -100)
        labels[:, 0] = -100  # the last prompt token: context only, as in TRL's labels
        out = model(input_ids=rest, attention_mask=attention_mask, past_key_values=cache, labels=labels,
                    fused_lm_head=True)
    logps = out.log_probs[:, -logits_to_keep:]
    entropy = out.entropy[:, -logits_to_keep:] if compute_entropy else None
    return logps, entropy


def per_token_logps(trainer, trl_path, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                    compute_entropy=False, compute_aux_loss=False, **extra):
    """`GRPOTrainer._get_per_token_logps_and_entropies` for a trainer with `share_prompt`: a batch whose rows share
    their prompt is scored by `score_with_shared_prompt` (chunked by `batch_size` as TRL chunks); any other batch,
    or `share_prompt` off, goes to `trl_path` (TRL's own method) unchanged."""
    import torch

    span = None
    if trainer.share_prompt:
        span = shared_prompt(model, input_ids, attention_mask, logits_to_keep,
                             gradient_checkpointing=bool(getattr(model, "is_gradient_checkpointing", False)),
                             multimodal=any(v is not None for v in extra.values()), aux_loss=compute_aux_loss)
    if span is None:
        return trl_path(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                        compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)
    trainer.shared_prompt_batches += 1
    step = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), step):
        lp, ent = score_with_shared_prompt(model, input_ids[start:start + step], attention_mask[start:start + step],
                                           logits_to_keep, span[0], trainer.accelerator.autocast, compute_entropy)
        logps.append(lp)
        entropies.append(ent)
    return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None


# TRL's modules that import vLLM when they are imported, if it is installed (`trl.import_utils.is_vllm_available`)
_VLLM_MODULES = ("trl.generation.vllm_client", "trl.generation.vllm_generation", "trl.generation")
_WITHOUT_VLLM: set[str] = set()  # those of them imported here as if vLLM were absent


def grpo_trainer_class(use_vllm: bool):
    """TRL's `GRPOTrainer`, imported without vLLM unless the stage generates with it (`use_vllm`).

    Importing TRL's GRPO trainer imports vLLM whenever it is installed (its generation modules do so at import),
    though only `use_vllm=True` ever calls it: that is 3.3 s of a smoke stage child's 21 s on 2 cores (the
    trainer's import measured alone: `python -m evals.bench.bench_trainer_import`). Without `use_vllm`, TRL's
    generation modules are imported as on a machine without vLLM (TRL's own `is_vllm_available` answers False
    while they load); nothing else changes. A later `use_vllm=True` in the same process imports them again with
    vLLM. `ENV_ENGINEER_TRL_PATCH=0` imports TRL as shipped, as for the other changes."""
    import importlib

    import trl.import_utils as trl_imports

    if use_vllm:
        for name in [n for n in _VLLM_MODULES if n in _WITHOUT_VLLM]:  # vllm_client first: the others import it
            importlib.reload(sys.modules[name])
            _WITHOUT_VLLM.discard(name)
    elif "trl.trainer.grpo_trainer" not in sys.modules and os.environ.get("ENV_ENGINEER_TRL_PATCH", "1") != "0":
        fresh = [n for n in _VLLM_MODULES if n not in sys.modules]
        real = trl_imports.is_vllm_available

        def absent(min_version: str | None = None) -> bool:
            return False

        trl_imports.is_vllm_available = absent
        try:
            importlib.import_module("trl.trainer.grpo_trainer")
        finally:
            trl_imports.is_vllm_available = real
            for name in fresh:
                module = sys.modules.get(name)
                if module is not None and getattr(module, "is_vllm_available", None) is absent:
                    module.is_vllm_available = real  # later calls ask the real question
                    _WITHOUT_VLLM.add(name)
    from trl import GRPOTrainer

    return GRPOTrainer
