"""The GRPO rollout copy's linear layers on CPU: weights packed once for oneDNN (`prepack_linears`). Used by
`trainer.grpo_trainer.RolloutCopy` with `train.rollout_prepack`; the trained model keeps torch's own linears."""

from __future__ import annotations

import functools

PREPACK_ROWS = 16  # oneDNN's blocking hint for a packed weight: the cpu preset's rows per decode step (1 x 16)


def pack_linear(module) -> None:
    """(Re)pack `module.weight` (an nn.Linear's) for oneDNN into `module.packed_weight`."""
    import torch

    module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PREPACK_ROWS)


def _packed_linear_forward(module, x):
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, module.packed_weight, module.bias, "none", [None], "")


def prepack_linears(model) -> dict[int, list]:
    """Run every float32 or bf16 CPU `nn.Linear` of `model` (a sampler, called under no_grad) through oneDNN on its
    weight packed once, instead of MKL's matmul, which packs the weight anew on every call.

    A decode step multiplies 16 rows by each weight, so that repacking is most of its cost: on an AVX2-only AMD EPYC
    Zen 3 (2 threads) MKL reads a streamed 576 x 1536 weight at 3.3 GB/s, against 19 GB/s for a plain sum, and the
    16 x 49,152 LM head takes 35-49 ms against 12-18 ms packed. The values are oneDNN's float32 products (rounding
    differs from MKL's at 1e-6 relative; the greedy tokens of `evals.bench.bench_rollout` are equal). The packed copy
    is stale once a weight changes: `RolloutCopy.synced` re-packs the weights it copies. Returns the packed modules
    by the id of their weight (a tied LM head shares the embedding's).
    """
    import torch

    packed: dict[int, list] = {}
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.device.type == "cpu"
                and module.weight.dtype in (torch.float32, torch.bfloat16)):
            pack_linear(module)
            module.forward = functools.partial(_packed_linear_forward, module)
            packed.setdefault(id(module.weight), []).append(module)
    return packed
