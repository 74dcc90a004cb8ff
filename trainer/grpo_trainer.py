"""Dynamic sampling for TRL's `GRPOTrainer`: drop groups without reward variance and sample fresh ones.

A GRPO group whose completions all get the same reward has zero advantage: it costs a generation and a
backward pass and teaches nothing. DAPO (Yu et al. 2025) drops such groups and samples new prompts until the
batch is full of groups with signal. TRL 1.16 does not do this itself; `DynamicSamplingGRPOTrainer` does, in
a bounded form:

- after TRL generated and scored a generation batch, every zero-variance group is a candidate for
  replacement;
- fresh prompts are drawn from the stage's own training set, generated and scored the same way, and each
  fresh group *with* variance replaces one zero-variance group. With a `group_key` (a dataset column: the level,
  in trainer.trl_setup.grpo_config), the draw leans to the keys where the policy is sometimes right: a key is picked with
  probability proportional to (its groups with variance + 1) / (its groups + 2) among the keys of the stage's
  set, counted over every group generated so far in the stage, then a row of that key at random. The engineer's
  allocation still decides what the first draw of every batch holds; only the replacements lean;
- at most `resample_rounds` extra generations per batch (every knob is a field of the trainer's config,
  `trainer.grpo_config.DynamicSamplingGRPOConfig`). What cannot be replaced stays: a step never has a
  smaller or an empty batch, only a batch with fewer dead groups;
- once two batches in a row found no fresh group with variance, resampling is off for the rest of the stage:
  a stage whose sizes are all out of the policy's reach pays for at most two futile rounds per batch, twice.

What was done is counted in `stats` (groups generated, zero-variance groups generated, groups replaced, the
zero-variance share left in the batches that were trained on) and reported by `trainer.stage` as
`train/resample_*` and `train/zero_std_groups_trained` in metrics.json.

Only one training process is supported (every CPU run): with several, each process would call TRL's
gathering generation a different number of times. With more than one process the trainer warns once and
leaves the batch as TRL made it.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any

from trainer.rollout_attention import use_gqa_sdpa
from trainer.rollout_linear import pack_linear, prepack_linears
from trainer.rollout_sampling import _inverse_cdf_class

log = logging.getLogger(__name__)

# Padded per-row tensors in TRL 1.16's generation output, and on which side they are padded.
_LEFT_PADDED = ("prompt_ids", "prompt_mask")
_RIGHT_PADDED = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "sampling_per_token_logps",
    "ref_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
_PER_ROW = ("advantages",)


def zero_variance_groups(advantages, group_size: int, eps: float = 1e-6) -> list[int]:
    """Indices of the groups (consecutive runs of `group_size` rows) whose advantages are all zero."""
    adv = advantages.reshape(-1, group_size)
    return [int(i) for i in (adv.abs().amax(dim=1) < eps).nonzero().flatten().tolist()]


def replace_groups(batch: dict, fresh: dict, slots: list[int], picks: list[int], group_size: int, pad_id: int):
    """`batch` with its groups `slots[i]` replaced by `fresh`'s groups `picks[i]`, re-padded to a common width.

    Left-padded prompt tensors are padded on the left, completion tensors on the right (TRL's layout);
    `num_items_in_batch` is recounted from the completion (and tool) masks. Any other tensor key is refused,
    since it is not known how to merge it (multimodal inputs never occur in this project)."""
    import torch
    import torch.nn.functional as F

    out = dict(batch)
    for key, value in batch.items():
        if key == "num_items_in_batch" or not torch.is_tensor(value):
            continue
        other = fresh.get(key)
        if other is None:
            raise ValueError(f"dynamic sampling: the fresh batch has no {key!r}")
        if key in _PER_ROW:
            width = None
        elif key in _LEFT_PADDED or key in _RIGHT_PADDED:
            width = max(value.shape[1], other.shape[1])
        else:
            raise ValueError(f"dynamic sampling: do not know how to merge {key!r} of TRL's generation output")
        a, b = value, other
        if width is not None:
            fill = pad_id if key == "prompt_ids" else 0
            left = key in _LEFT_PADDED
            a = F.pad(a, (width - a.shape[1], 0) if left else (0, width - a.shape[1]), value=fill)
            b = F.pad(b, (width - b.shape[1], 0) if left else (0, width - b.shape[1]), value=fill)
        a = a.clone()
        for slot, pick in zip(slots, picks, strict=True):
            a[slot * group_size : (slot + 1) * group_size] = b[pick * group_size : (pick + 1) * group_size]
        out[key] = a
    if "num_items_in_batch" in batch:
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        out["num_items_in_batch"] = mask.sum()
    return out


@functools.cache
def _growing_cache_class():
    """`GrowingCache`, built on first use so that importing this module needs no transformers."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        _room = 256
        _kbuf = _vbuf = None

        def _append(self, buf, held, new):
            length, n = (held.shape[-2] if held.dim() == 4 else 0), new.shape[-2]
            if buf is None or held.dim() != 4 or held.data_ptr() != buf.data_ptr() or held.shape[:2] != buf.shape[:2] \
                    or length + n > buf.shape[-2]:
                grown = new.new_empty(*new.shape[:2], length + n + self._room, new.shape[-1])
                if length:
                    grown[..., :length, :] = held
                buf = grown
            buf[..., length:length + n, :] = new
            return buf, buf[..., :length + n, :]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self._kbuf = self._vbuf = None
            self._kbuf, self.keys = self._append(self._kbuf, self.keys, key_states)
            self._vbuf, self.values = self._append(self._vbuf, self.values, value_states)
            return self.keys, self.values

    class GrowingCache(DynamicCache):
        def __init__(self, n_layers: int):
            Cache.__init__(self, layers=[GrowingLayer() for _ in range(n_layers)])

    return GrowingCache


def growing_cache(n_layers: int):
    """A `DynamicCache` of `n_layers` layers that write each new token into spare room instead of concatenating.

    transformers' `DynamicLayer.update` is `torch.cat([keys, new])`: a copy of the layer's whole KV cache for every
    generated token. Measured at the rollout shape (8 rows, 3 KV heads, 600 positions, bf16, 1 thread): the cat
    doubles the time of the decode attention that follows it (0.32 -> 0.65 ms per layer), while attention over a
    view of a larger buffer costs the same as over a contiguous tensor. The layer keeps `keys`/`values` as views
    of buffers grown 256 positions at a time, so every other method of `DynamicLayer` works on them unchanged;
    one that replaces them (crop, beam reorder) just makes the next update start a fresh buffer. Full-attention
    layers only: `with_growing_cache` uses it only where transformers would have made plain `DynamicLayer`s.
    """
    return _growing_cache_class()(n_layers)


def with_growing_cache(model):
    """Make `model.generate` use a `growing_cache()` wherever transformers would have made its default cache.

    The decision is taken after `generate` resolved its settings (the call's and the model's generation config):
    only a fresh `DynamicCache` of plain full-attention `DynamicLayer`s, not offloaded and not an assistant's, is
    replaced. A cache passed by the caller, `use_cache=False`, a static or quantized cache, sliding-window or
    linear-attention layers are all left to transformers. Returns `model`.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    plain = type(model)._prepare_cache_for_generation

    def prepare(generation_config, model_kwargs, *args, **kwargs):
        given = model_kwargs.get("past_key_values")
        out = plain(model, generation_config, model_kwargs, *args, **kwargs)
        made = model_kwargs.get("past_key_values")
        if (given is None and type(made) is DynamicCache and made.layers and not made.offloading
                and all(type(layer) is DynamicLayer and not layer.is_initialized for layer in made.layers)
                and not generation_config.is_assistant):
            model_kwargs["past_key_values"] = growing_cache(len(made.layers))
        return out

    model._prepare_cache_for_generation = prepare
    return model


def _prefill_each_prompt_once(model, input_ids, model_kwargs) -> bool:
    """Fill the fresh `GrowingCache` of a generate call with the prompt, computed once per distinct prompt.

    TRL repeats every prompt `num_generations` times (1 prompt x 16 completions in the cpu preset), and the prefill
    computes each copy anew: 15 % of a rollout's generate time on 2 cores. Here the distinct rows (same tokens, same
    padding) run once over all but their last position, their keys and values are copied to every row that repeats
    them, and transformers' own prefill then runs just the last position of every row (it continues a cache that
    already holds the rest). The distinct rows get the same position ids as generate gave them (counted from the
    padding), so the cache holds what the per-row prefill would have computed. Rows without an attention mask are
    unpadded (generate drops an all-ones mask). Nothing is done (False) when the rows are all distinct or when the
    cache is not a fresh `growing_cache()`.
    """
    import torch

    cache, mask = model_kwargs.get("past_key_values"), model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")  # generate's, from the padding; else the model's own (arange)
    if (not isinstance(cache, _growing_cache_class()) or cache.get_seq_length()
            or (mask is not None and mask.shape != input_ids.shape) or input_ids.shape[1] < 2
            or model_kwargs.get("inputs_embeds") is not None
            or (positions is not None and positions.shape != input_ids.shape)):
        return False
    # generate drops an all-ones mask (rows of one length: no padding), as it does for every row of one prompt
    rows = input_ids if mask is None else torch.cat([input_ids, mask.to(input_ids.dtype)], 1)
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    n = int(inverse.max()) + 1
    if n == input_ids.shape[0]:
        return False
    first = torch.full((n,), input_ids.shape[0], dtype=torch.long).scatter_reduce_(
        0, inverse, torch.arange(input_ids.shape[0]), "amin")
    once = growing_cache(len(cache.layers))
    model(input_ids=input_ids[first, :-1], attention_mask=None if mask is None else mask[first, :-1],
          past_key_values=once, use_cache=True, logits_to_keep=1,
          **({} if positions is None else {"position_ids": positions[first, :-1]}))
    for held, layer in zip(once.layers, cache.layers, strict=True):
        layer.update(held.keys.index_select(0, inverse), held.values.index_select(0, inverse))
    return True


def _rollout_decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """transformers' `_sample` loop (passed to `generate` as `custom_generate`), for the rollout copy.

    - Each distinct prompt is prefilled once (`_prefill_each_prompt_once`).
    - Sampled generation: `generate` has built the processors, warpers included, from the sampling config; the loop
      runs with `InverseCdfSampling` appended and a
      copy of that config whose `do_sample` is off, so its token selection is the argmax of the one-hot scores.
      Greedy generation runs the loop as it is.
    """
    import copy

    from transformers import LogitsProcessorList

    _prefill_each_prompt_once(model, input_ids, model_kwargs)
    if generation_config.do_sample:
        generation_config = copy.copy(generation_config)
        generation_config.do_sample = False
        logits_processor = LogitsProcessorList([*logits_processor, _inverse_cdf_class()()])
    return type(model)._sample(model, input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                               generation_config=generation_config, **model_kwargs)


def with_rollout_decoding(model):
    """Make `model.generate` decode with `_rollout_decode`: each distinct prompt prefilled once, sampled tokens drawn
    by inverse CDF (`InverseCdfSampling`) instead of `torch.multinomial`.

    Only greedy or plain multinomial sampling on CPU is routed there (a generation config passed, as TRL does, whose
    mode is GREEDY_SEARCH or SAMPLE: one beam, no assistant; no custom loop of the caller's); everything else goes
    to transformers unchanged. Measured on a [8, 49152] row of scores, 1 thread: multinomial 12.5 ms, inverse CDF
    1.8 ms per token. Returns `model`.
    """
    from transformers.generation.configuration_utils import GenerationMode

    plain = model.generate

    def generate(*args, **kwargs):
        cfg = kwargs.get("generation_config")
        if (cfg is not None and model.device.type == "cpu" and kwargs.get("custom_generate") is None
                and cfg.get_generation_mode(kwargs.get("assistant_model")) in (GenerationMode.SAMPLE,
                                                                                GenerationMode.GREEDY_SEARCH)):
            kwargs["custom_generate"] = _rollout_decode
        return plain(*args, **kwargs)

    model.generate = generate
    return model


class RolloutCopy:
    """A copy of the policy in another dtype (bf16) that generates GRPO's completions on CPU.

    Decoding a 135M model on 2 cores is bound by reading its weights once per token; bf16 halves those bytes.
    The copy is made on first use and re-synced from the trained weights after every optimiser step (only the
    parameters that train are copied: the top blocks). Training itself stays in the trained model's dtype.
    The losses score the completions with the trained model. The copy's bf16 rounding makes the sampler slightly
    off-policy, and unlike TRL's vLLM path nothing corrects for it (TRL computes its importance-sampling ratio only
    with vLLM); with beta=0 and one update per generation (the cpu preset) the ratio TRL trains on is exactly 1.
    With `prepack` its linear layers run on oneDNN-packed weights (`trainer.rollout_linear`), re-packed at every sync.
    """

    def __init__(self, dtype, prepack: bool = False):
        import torch

        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.prepack = bool(prepack)  # linear layers on oneDNN-packed weights (`prepack_linears`)
        self.packed: dict = {}  # id of a packed weight -> its Linear modules, when prepack
        self.model = None
        self.step = None
        self.syncs = 0

    def synced(self, trained, step: int):
        """The copy, with `trained`'s current weights (copied when `step` moved since the last sync)."""
        import copy

        import torch

        if self.model is None:
            # requires_grad stays on for every weight (sampling runs under no_grad anyway). torch's matmul folds
            # the prefill's last-position slice of the hidden states (a non-contiguous [rows, 1, 576] view) into
            # one mm only when the weight requires grad; a frozen LM head (the tied embedding, frozen with the
            # lower blocks) is instead expanded into a bmm over the rows, a copy of rows x 576 x 49,152 per
            # generate call: about 1 s at 16 rows here (4.6 -> 3.5 s for 16 x 48 greedy tokens).
            self.model = copy.deepcopy(trained).eval().requires_grad_(True)
            # weights only: `.to(dtype)` would also round the float32 buffers (RoPE's inv_freq: phase errors of
            # about 0.6 rad by position 450), which a model loaded in bf16 keeps in float32. Tied weights stay tied.
            for p in self.model.parameters():
                p.data = p.data.to(self.dtype)
            # Wrappers set on instances (accelerate's prepare, TRL's fused LM head) are closures over the *trained*
            # model's bound forward, which deepcopy does not rebind: left in place, the copy would run the trained
            # model in its own dtype. Sampling needs the plain forward of the copy's class, without hooks.
            for module in self.model.modules():
                module.__dict__.pop("forward", None)
                module._forward_hooks.clear()
                module._forward_pre_hooks.clear()
            use_gqa_sdpa(self.model)  # the copy only: training keeps transformers' attention
            with_growing_cache(self.model)
            with_rollout_decoding(self.model)
            self._params = dict(self.model.named_parameters())
            self._train = [n for n, p in trained.named_parameters() if p.requires_grad]
            if self.prepack:
                self.packed = prepack_linears(self.model)
        elif step != self.step:
            src = dict(trained.named_parameters())
            with torch.no_grad():
                for n in self._train:
                    self._params[n].copy_(src[n])
                    for module in self.packed.get(id(self._params[n]), ()):  # the trained weights, packed anew
                        pack_linear(module)
            self.syncs += 1
        self.step = step
        return self.model


def make_trainer_class(use_vllm: bool):
    """`DynamicSamplingGRPOTrainer`, built on first use so that importing this module needs no TRL; `use_vllm`:
    whether its stage generates with vLLM (TRL's trainer is imported without vLLM otherwise: `trainer.trl_cpu`)."""
    from trainer.trl_cpu import grpo_trainer_class

    GRPOTrainer = grpo_trainer_class(use_vllm)

    class DynamicSamplingGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer plus bounded DAPO-style dynamic sampling (see the module docstring)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            from trainer.trl_setup import rollout_dtype, rollout_prepack

            a = self.args  # a trainer.grpo_config.DynamicSamplingGRPOConfig (a plain GRPOConfig: its defaults)
            self.share_prompt = bool(getattr(a, "share_prompt", False))
            self.shared_prompt_batches = 0  # scoring calls that ran their rows' common prompt once
            # the rollout copy's dtype, resolved against the model it copies (None: sample with the model itself)
            self.rollout_dtype = rollout_dtype(a, self.model) if hasattr(a, "rollout_dtype") else None
            self.rollout = (RolloutCopy(self.rollout_dtype, prepack=rollout_prepack(a, self.rollout_dtype))
                            if self.rollout_dtype is not None and not self.use_vllm
                            else None)
            self.resample_rounds = int(getattr(a, "resample_rounds", 0))
            seed = getattr(a, "resample_seed", None)
            self._rng = random.Random(a.seed if seed is None else seed)
            column = getattr(a, "group_key", None)
            self.group_key = None if column is None else (lambda row: row[column])
            self._index_rows()
            self.key_stats: dict[Any, list[int]] = {}  # key -> [groups with variance, groups]
            self.stats = {"groups": 0, "zero_groups": 0, "replaced": 0, "rounds": 0, "trained_groups": 0,
                          "trained_zero_groups": 0}
            self._warned = False
            self._futile = 0  # batches in a row whose resampling found no group with variance

        def _index_rows(self) -> None:
            self._rows_by_key: dict[Any, list[int]] = {}
            if self.group_key is not None:
                for i, row in enumerate(self.train_dataset):
                    self._rows_by_key.setdefault(self.group_key(row), []).append(i)

        def sampler_model(self):
            """The model that samples GRPO's completions now: the synced rollout copy, or the trained model."""
            model = self.accelerator.unwrap_model(self.model)
            return model if self.rollout is None else self.rollout.synced(model, self.state.global_step)

        def _fresh_rows(self, n_groups: int) -> list[dict[str, Any]]:
            data = self.train_dataset
            rows = []
            keys = list(self._rows_by_key)
            weights = [(self.key_stats.get(k, [0, 0])[0] + 1) / (self.key_stats.get(k, [0, 0])[1] + 2) for k in keys]
            for _ in range(n_groups):
                if keys:
                    pool = self._rows_by_key[self._rng.choices(keys, weights)[0]]
                    row = data[pool[self._rng.randrange(len(pool))]]
                else:
                    row = data[self._rng.randrange(len(data))]
                rows.extend([row] * self.num_generations)
            return rows

        def _count(self, inputs, zero: set[int]) -> None:
            if self.group_key is None:
                return
            for gi in range(len(inputs) // self.num_generations):
                st = self.key_stats.setdefault(self.group_key(inputs[gi * self.num_generations]), [0, 0])
                st[0] += gi not in zero
                st[1] += 1

        def _generate_single_turn(self, *args, **kwargs):
            if self.rollout is None:
                return super()._generate_single_turn(*args, **kwargs)
            # TRL's own transformers path, run on the synced rollout copy instead of the trained model
            trained = self.model_wrapped
            self.model_wrapped = self.rollout.synced(self.accelerator.unwrap_model(self.model),
                                                     self.state.global_step)
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                self.model_wrapped = trained

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
            from trainer.trl_cpu import per_token_logps

            return per_token_logps(self, super()._get_per_token_logps_and_entropies, model, input_ids,
                                   attention_mask, logits_to_keep, **kw)

        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            if not self.model.training:
                return batch
            g = self.num_generations
            zero = zero_variance_groups(batch["advantages"], g)
            self._count(inputs, set(zero))
            self.stats["groups"] += batch["advantages"].numel() // g
            self.stats["zero_groups"] += len(zero)
            if zero and self.resample_rounds and self.accelerator.num_processes > 1 and not self._warned:
                log.warning("dynamic sampling needs a single training process; it is off for this run")
                self._warned = True
            rows = list(inputs)
            rounds, found = 0, 0
            while (zero and rounds < self.resample_rounds and self._futile < 2
                   and self.accelerator.num_processes == 1):
                rounds += 1
                fresh_rows = self._fresh_rows(len(zero))
                fresh = super()._generate_and_score_completions(fresh_rows)
                fresh_zero = set(zero_variance_groups(fresh["advantages"], g))
                self._count(fresh_rows, fresh_zero)
                n_fresh = fresh["advantages"].numel() // g
                self.stats["groups"] += n_fresh
                self.stats["zero_groups"] += len(fresh_zero)
                picks = [i for i in range(n_fresh) if i not in fresh_zero]
                if picks:
                    slots, picks = zero[: len(picks)], picks[: len(zero)]
                    batch = replace_groups(batch, fresh, slots, picks, g, self.processing_class.pad_token_id)
                    for slot, pick in zip(slots, picks, strict=True):
                        rows[slot * g : (slot + 1) * g] = fresh_rows[pick * g : (pick + 1) * g]
                    self.stats["replaced"] += len(slots)
                    found += len(slots)
                    zero = zero[len(slots):]
            if rounds:
                self._futile = 0 if found else self._futile + 1
            self.stats["rounds"] += rounds
            self.stats["trained_groups"] += batch["advantages"].numel() // g
            self.stats["trained_zero_groups"] += len(zero)
            return batch

    return DynamicSamplingGRPOTrainer


def sampling_metrics(stats: dict) -> dict[str, float]:
    """`train/...` figures of a stage's dynamic sampling (`DynamicSamplingGRPOTrainer.stats`)."""
    groups, trained = stats.get("groups", 0), stats.get("trained_groups", 0)
    return {
        "train/resample_groups_generated": groups,
        "train/resample_zero_std_generated": stats.get("zero_groups", 0) / groups if groups else float("nan"),
        "train/resample_replaced": stats.get("replaced", 0),
        "train/resample_rounds": stats.get("rounds", 0),
        "train/zero_std_groups_trained": stats.get("trained_zero_groups", 0) / trained if trained else float("nan"),
    }
