"""LoRA weight syncs into TRL's vLLM that leave the trained model's base weights exactly as they were.

TRL 1.16 pushes a PEFT model's weights to vLLM (`VLLMGeneration._iter_named_params`, colocate and server
mode) by `model.merge_adapter()` (base += delta, in place), reading every parameter, then
`model.unmerge_adapter()` (base -= delta, in place). In bf16, (w + d) - d is not w: each sync leaves a
rounding error in the frozen base weights, and a paper stage syncs about 1,000 times (huggingface/trl#6688 measured
the drift growing). tests/test_lora_sync.py measures it on a bf16 layer and shows the replacement exact.

`install_exact_lora_sync()` replaces that method for the plain case (one GPU or DDP, no FSDP): the base weights
are never written. Each LoRA-wrapped weight is sent as a new tensor, `base + delta` for every active adapter
in merge order, computed exactly as peft's merge computes it (`(w + delta).to(w.dtype)`, the in-place
`w += delta` of a bf16 weight with an fp32 delta rounds once, the same way), so vLLM gets the very values
TRL's merge would give it. Names follow TRL's rules (prefix `base_model.model.` and `.base_layer` removed, LoRA
and `original_module` parameters skipped, `modules_to_save.default.` removed). FSDP and LoRA variants (DoRA,
whose merge depends on the weight norm) keep TRL's own path. Under DeepSpeed ZeRO-3 the parameters are
gathered as TRL gathers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


def _lora_layers(model) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in model.named_modules() if isinstance(mod, LoraLayer)}


def has_variants(model) -> bool:
    """True when an active adapter of a LoRA layer is a variant (DoRA, ...) whose merge is not a plain sum."""
    return any(
        a in getattr(layer, "lora_variant", {}) for layer in _lora_layers(model).values() for a in layer.active_adapters
    )


def exact_merged_params(model, fix_name: Callable[..., str]) -> Iterator[tuple[str, object]]:
    """(vLLM name, tensor) for every weight of PEFT `model` with its active LoRA adapters merged into a copy;
    the model's own tensors are never modified. `fix_name(name, extra_prefixes=...)`: TRL's name fixer."""
    layers = _lora_layers(model)
    prefix = model.prefix  # "lora_"
    for name, param in model.named_parameters():
        if prefix in name or "original_module" in name:  # TRL: LoRA parameters and saved originals are not sent
            continue
        vname = fix_name(name.removeprefix("base_model.model.").replace(".base_layer", ""),
                         extra_prefixes=["modules_to_save.default."])
        value = param.data
        owner, _, leaf = name.rpartition(".")
        layer = layers.get(owner.removesuffix(".base_layer")) if owner.endswith(".base_layer") else None
        if layer is not None and not layer.disable_adapters:
            for adapter in layer.active_adapters:  # the order merge_adapter() merges them in
                if adapter not in layer.lora_A:
                    continue
                if leaf == "weight":
                    value = (value + layer.get_delta_weight(adapter)).to(param.dtype)
                elif leaf == "bias" and layer.lora_bias.get(adapter):
                    value = (value + layer.lora_B[adapter].bias * layer.scaling[adapter]).to(param.dtype)
        yield vname, value


def install_exact_lora_sync() -> bool:
    """Make TRL's vLLM weight sync of PEFT models exact (see module doc); idempotent. False without TRL's vLLM
    module (nothing to patch)."""
    try:
        from accelerate.utils import is_peft_model
        from trl.generation.vllm_generation import VLLMGeneration
    except ImportError:
        return False
    if getattr(VLLMGeneration, "_exact_lora_sync", False):
        return True
    original = VLLMGeneration._iter_named_params

    def _iter_named_params(self):
        model = self.model
        if not is_peft_model(model) or self._dist.is_fsdp or has_variants(model):
            yield from original(self)
            return
        with self._dist.gather_params(list(model.parameters())):
            yield from exact_merged_params(model, self._fix_param_name_to_vllm)

    _iter_named_params.__doc__ = "TRL's weight iterator, with LoRA merged into copies (trainer.lora_sync)."
    VLLMGeneration._iter_named_params = _iter_named_params
    VLLMGeneration._exact_lora_sync = True
    VLLMGeneration._trl_iter_named_params = original
    return True
