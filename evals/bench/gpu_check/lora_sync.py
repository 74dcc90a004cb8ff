"""The GPU check's LoRA sync section: `trainer.lora_sync` on a bf16 LoRA model of the tiny model, on the device."""

from __future__ import annotations

import copy
import time
from pathlib import Path

from evals.bench.gpu_check.model import cuda_sync
from evals.bench.gpu_check.report import Report


def lora_sync_checks(report: Report, device: str, model_dir: Path, cycles: int = 100) -> None:
    """trainer.lora_sync on a bf16 LoRA model of the tiny model on the device: exact against peft's merge_adapter
    and TRL's own iterator, and the base unchanged after `cycles` syncs; TRL's merge/unmerge drift beside it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.lora_sync import exact_merged_params, install_exact_lora_sync

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    # init_lora_weights=False: B is random, so every merge changes the weights, as after training
    model = get_peft_model(base, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", lora_dropout=0.0,
                                            init_lora_weights=False))

    def fix(name: str, extra_prefixes=None) -> str:  # TRL's VLLMGeneration._fix_param_name_to_vllm
        for prefix in ["_checkpoint_wrapped_module.", *(extra_prefixes or [])]:
            name = name.replace(prefix, "")
        return name

    def frozen(m) -> dict:
        return {n: p.detach().clone() for n, p in m.named_parameters() if "lora_" not in n}

    def peft_merged(m) -> dict:
        twin = copy.deepcopy(m)
        twin.merge_adapter()
        return {fix(n.removeprefix("base_model.model.").replace(".base_layer", ""),
                    extra_prefixes=["modules_to_save.default."]): p.detach().clone()
                for n, p in twin.named_parameters() if "lora_" not in n and "original_module" not in n}

    def nudge(m, step: int) -> None:  # an optimiser step between syncs: the adapter moves, the base does not
        g = torch.Generator(device="cpu").manual_seed(step)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_" in n:
                    p.add_((torch.randn(p.shape, generator=g) * 1e-3).to(device=p.device, dtype=p.dtype))

    lora_dtype = next(p.dtype for n, p in model.named_parameters() if "lora_" in n)
    start = frozen(model)
    trl_patch = install_exact_lora_sync()
    gen = None
    if trl_patch:
        from contextlib import nullcontext
        from types import SimpleNamespace

        from trl.generation.vllm_generation import VLLMGeneration

        gen = SimpleNamespace(model=model, _dist=SimpleNamespace(is_fsdp=False,
                                                                 gather_params=lambda params: nullcontext()),
                              _fix_param_name_to_vllm=fix)
    mismatched, compared, trl_mismatched, trl_compared = [], 0, [], 0
    t0 = time.perf_counter()
    for i in range(cycles):
        nudge(model, i)
        sent = {n: t.clone() if i in (0, cycles - 1) else t for n, t in exact_merged_params(model, fix)}
        if i in (0, cycles - 1):
            want = peft_merged(model)
            compared += 1
            if list(sent) != list(want):
                mismatched.append(f"cycle {i}: names differ")
            mismatched += [f"cycle {i}: {n}" for n in want if n in sent and not torch.equal(sent[n], want[n])]
            if gen is not None:
                trl_own = {n: t.clone() for n, t in VLLMGeneration._trl_iter_named_params(
                    SimpleNamespace(**{**vars(gen), "model": copy.deepcopy(model)}))}
                via_trl = {n: t.clone() for n, t in VLLMGeneration._iter_named_params(gen)}
                trl_compared += 1
                if list(via_trl) != list(trl_own):
                    trl_mismatched.append(f"cycle {i}: names differ")
                trl_mismatched += [f"cycle {i}: {n}" for n in trl_own
                                   if n in via_trl and not torch.equal(via_trl[n], trl_own[n])]
            changed = sum(int(not torch.equal(sent[n], start[f"base_model.model.{n}".replace(
                ".weight", ".base_layer.weight")])) for n in sent
                if f"base_model.model.{n}".replace(".weight", ".base_layer.weight") in start)
            if changed == 0:
                mismatched.append(f"cycle {i}: the merged weights equal the base (the adapter merged nothing)")
    cuda_sync()
    sync_s = (time.perf_counter() - t0) / cycles
    now = frozen(model)
    drifted = [n for n in start if not torch.equal(now[n], start[n])]

    # TRL's own merge/unmerge round trip on a copy, as many times: what the exact sync avoids
    twin = copy.deepcopy(model)
    twin_start = frozen(twin)
    for i in range(cycles):
        nudge(twin, i)
        twin.merge_adapter()
        twin.unmerge_adapter()
    twin_now = frozen(twin)
    drift_elems = sum(int((twin_now[n] != twin_start[n]).sum()) for n in twin_start)
    drift_max = max(float((twin_now[n].float() - twin_start[n].float()).abs().max()) for n in twin_start)
    total = sum(t.numel() for t in twin_start.values())
    where = f"{device}, base bf16, adapter {str(lora_dtype).removeprefix('torch.')}"
    report.doc["measurements"]["lora_sync"] = {
        "device": device, "cycles": cycles, "seconds_per_sync_tiny": round(sync_s, 5),
        "trl_merge_unmerge_drift": {"changed_elements": drift_elems, "of": total, "max_abs": drift_max}}
    report.check("lora_sync_exact", not mismatched and compared == 2,
                 f"{compared} syncs compared tensor by tensor with peft's merge_adapter ({where}): "
                 f"{len(mismatched)} differ{': ' + ', '.join(mismatched[:5]) if mismatched else ''}")
    if gen is None:
        report.skip("lora_sync_trl", "TRL's vLLM generation module could not be imported, so there is nothing to "
                    "patch")
    else:
        report.check("lora_sync_trl", not trl_mismatched and trl_compared == 2,
                     f"{trl_compared} syncs through TRL's patched iterator against TRL's own merge: "
                     f"{len(trl_mismatched)} differ{': ' + ', '.join(trl_mismatched[:5]) if trl_mismatched else ''}")
    report.check("lora_sync_base_unchanged", not drifted,
                 f"after {cycles} syncs {len(drifted)} of {len(start)} base tensors changed; TRL's merge/unmerge "
                 f"on a copy changed {drift_elems} of {total} base elements (max {drift_max:.3g})")
    del model, twin, base
