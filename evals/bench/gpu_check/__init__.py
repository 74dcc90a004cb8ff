"""The GPU training path, checked in one command: the `paper` preset's mechanics on a tiny random model, timed.

    PYTHONPATH=. python -m evals.bench.gpu_check --device cuda --out gpu_check.json     # one GPU, a few minutes
    python -m evals.bench.gpu_check --device cpu --steps 2 --out /tmp/gpu_check.json    # the same check on CPU

It runs from the source tree (nothing of the project is installed; `docs/gpu.md` says which wheels a bare GPU machine
needs) and writes one JSON file that names every check with `pass`, `fail` or `skipped` (with the reason):

- **the stage child process** (`trainer.child`, which runs `trainer.stage.run_stage`) trains TRL's GRPO on the
  transformers generation path (no vLLM) with the `paper` preset's levers: LoRA, gradient checkpointing, and on CUDA
  bf16 weights and TRL's Triton fused LM head;
- **in-stage checkpoint and resume**: the stage saves at step N/2 (`train.save_steps`), receives SIGTERM right after
  that checkpoint is complete and stops there; started again, it continues from it (`train/resumed_from_step`) to
  step N and leaves its final checkpoint; on CUDA the in-stage checkpoint holds the CUDA RNG state;
- **the exact LoRA sync** (`trainer.lora_sync`): on a bf16 LoRA model on the device, the merged weights it sends are
  bit-equal to peft's `merge_adapter` (and to TRL's own sync), and the frozen base is bit-identical after 100 syncs
  (TRL's merge/unmerge round trip, run beside it on a copy, says how much it would have drifted);
- **measurements**: seconds per GRPO step, tokens/s generated and trained, peak GPU memory, for the tiny model's
  shapes; on CUDA also a Qwen3-4B-shaped random model (bf16, LoRA r=32, gradient checkpointing, TRL's fused head):
  decoding at the paper's 64 completions per step and a training micro-batch of 8 at the paper's lengths, from which
  the `paper` preset's cost per stage is recomputed beside the README's derived estimate (8-14 h on one H100).

The tiny model is a Qwen3 architecture with 2 small layers, randomly initialised and saved to a temporary folder, with
the embedded SmolLM2 tokenizer (`--tokenizer DIR`; by default `.gpu_wheels/tokenizer` when it exists, else the
tokenizer of the embedded model, `llm_backends.models.resolve_model("smollm2-135m")`). Nothing is downloaded.
On CPU the CUDA-specific assertions are skipped, and say so. The exit status is 1 when any check failed.

The package, by responsibility: `model` (the tiny model, its tokenizer, the shapes), `report` (the checks and the
JSON), `stage` (the stage child process, its checkpoint, interruption and resume), `lora_sync` (the exact LoRA sync),
`timing` (step timing, the shape probe, the paper's cost), `cli` (the command line; `__main__` runs it).
"""

from __future__ import annotations

from evals.bench.gpu_check.cli import machine, main
from evals.bench.gpu_check.lora_sync import lora_sync_checks
from evals.bench.gpu_check.model import (
    CARRIED_TOKENIZER,
    QWEN3_4B,
    ROOT,
    TOKENIZER_FILES,
    build_tiny_model,
    cuda_sync,
    find_tokenizer,
    hide_vllm,
    save_tokenizer,
    tiny_shape,
)
from evals.bench.gpu_check.report import CHECKS, Report, log, section
from evals.bench.gpu_check.stage import instrumented_stage, run_stage_checks, stage_config
from evals.bench.gpu_check.timing import (
    README_ESTIMATE,
    paper_cost,
    paper_prompt_tokens,
    shape_probe,
    step_measurements,
)

__all__ = [
    "CARRIED_TOKENIZER", "CHECKS", "QWEN3_4B", "README_ESTIMATE", "ROOT", "TOKENIZER_FILES", "Report",
    "build_tiny_model", "cuda_sync", "find_tokenizer", "hide_vllm", "instrumented_stage", "log", "lora_sync_checks",
    "machine", "main", "paper_cost", "paper_prompt_tokens", "run_stage_checks", "save_tokenizer", "section",
    "shape_probe", "stage_config", "step_measurements", "tiny_shape",
]
