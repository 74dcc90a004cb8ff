"""Signals and child processes of `python -m graph.run`.

The first SIGINT/SIGTERM asks the run to stop at the next training step, evaluation batch or node (trainer.stop) and raises
nothing: a KeyboardInterrupt raised from a handler can land in a __del__, where Python ignores it, and
training goes on. Before the graph streams and at the --approve prompt nothing is in flight: the first
signal interrupts at once. A second signal kills the vLLM servers and every child process and exits."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from graph.progress import say
from trainer import stop

EXIT_INTERRUPTED = 130

# count: signals received; interruptible: the first one raises KeyboardInterrupt (nothing in flight yet);
# run_dir: the folder the resume hint names
SIGNALS: dict[str, Any] = {"count": 0, "interruptible": True, "run_dir": None}


def resume_hint() -> str:
    run_dir = SIGNALS.get("run_dir")
    return f"resume with: python -m graph.run --resume {run_dir}" if run_dir else "nothing to resume"

def _on_signal(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    name = signal.Signals(signum).name
    SIGNALS["count"] += 1
    if SIGNALS["count"] == 1 and SIGNALS["interruptible"]:
        raise KeyboardInterrupt
    if SIGNALS["count"] == 1:
        stop.request_stop(name)
        _write_now(f"\n[stop] {name}: stopping at the next training step, evaluation batch or node boundary; the finished work is "
                   f"kept ({name} again stops at once)\n")
        return
    _write_now(f"\n[stop] {name} again: stopping now; {resume_hint()}\n")
    _kill_children()
    os._exit(EXIT_INTERRUPTED)


def _write_now(text: str) -> None:
    try:  # os.write, not print: a handler may run while the main thread is inside a print to stderr
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def _kill_children() -> None:
    """SIGKILL the vLLM servers (their groups and engine cores) and every other process below this one."""
    from llm_backends.server_cleanup import descendants, kill_all

    try:
        kill_all()
    except Exception:  # noqa: BLE001 - exiting anyway: kill what can be killed
        pass
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def install_signal_handlers() -> None:
    """Our handler for SIGINT and SIGTERM, with a fresh count and stop flag (one per `main` call)."""
    from llm_backends.server_cleanup import defer_signal_cleanup

    SIGNALS.update(count=0, interruptible=True, run_dir=None)
    stop.reset()
    defer_signal_cleanup()  # the servers' own handlers (chained on first start) leave the first signal to us
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


def stop_servers() -> None:
    """Stop the kept and every other vLLM server this process started, before its run folder is free."""
    if "llm_backends.vllm_server" not in sys.modules:
        return
    from llm_backends.policy import stop_kept_server
    from llm_backends.server_cleanup import stop_all

    try:
        stop_kept_server()
        stop_all()
    except Exception as e:  # noqa: BLE001 - exiting: atexit and the launcher's watchdog still stop them
        say(f"[warn] could not stop a vLLM server: {e}")
