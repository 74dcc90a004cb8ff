"""Stopping vLLM servers for sure: the kills of a server's process group and descendants, and the registry of
live servers that are stopped at interpreter exit and on SIGINT/SIGTERM.

Every started server is held (a strong reference) until ``stop()``, so one whose owner dropped it is still
stopped at exit. SIGINT/SIGTERM handlers can only be installed from the main thread: they are installed by the
first ``VLLMServer.start()`` on the main thread (or by :func:`install_signal_handlers`); a server started from
another thread before that is covered by atexit and, once any later main-thread start or call installs them, by
the handlers too. A server's child also gets SIGTERM when its parent dies without cleaning up (Linux,
:func:`die_with_parent`).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class Server(Protocol):
    """What clean-up needs of a server (`llm_backends.vllm_server.VLLMServer`): this module never imports it."""

    def stop(self, timeout_s: float = 20.0) -> None: ...

    def kill_now(self) -> None: ...

# servers started and not yet stopped; strong references, so a server its owner dropped is still stopped
_LIVE: dict[int, Server] = {}
_ATEXIT_REGISTERED = False
_HANDLERS_INSTALLED = False
_DEFERRED = False  # True: the process's own SIGINT/SIGTERM handler decides when servers stop (graph.run)
_GUARD = threading.RLock()  # re-entrant: a signal handler may run stop_all() while the main thread holds it


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group `proc` leads (VLLMServer starts each server in a session of its own)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list[int]:
    """PIDs of every process below ``pid`` (children, grandchildren, ...), from psutil or /proc."""
    try:
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    except ImportError:
        pass
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def group_alive(pgid: int, wait_s: float = 0.0) -> bool:
    """True while any process of group ``pgid`` exists (zombies awaiting their reaper count), polled."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)


def die_with_parent() -> None:
    """In the child: SIGTERM when the parent dies, even by SIGKILL (Linux; the forking thread must be
    the main thread, because the signal fires when the forking *thread* exits)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: atexit and signal handlers still apply
        pass


def register(server: Server) -> None:
    """Hold a started server until `unregister`, and make sure exit and signals stop it."""
    global _ATEXIT_REGISTERED
    with _GUARD:
        _LIVE[id(server)] = server
        if not _ATEXIT_REGISTERED:
            atexit.register(stop_all)
            _ATEXIT_REGISTERED = True
    if not install_signal_handlers():
        log.debug("vLLM server started off the main thread: SIGINT/SIGTERM clean-up waits for a main-thread start")


def install_signal_handlers() -> bool:
    """Chains SIGINT/SIGTERM handlers that stop every live server; True once they are installed.

    Only the main thread may install signal handlers: from any other thread this does nothing and returns
    False (the next call from the main thread, e.g. the next ``start()``, installs them). Idempotent."""
    global _HANDLERS_INSTALLED
    if threading.current_thread() is not threading.main_thread():
        return _HANDLERS_INSTALLED
    with _GUARD:
        if not _HANDLERS_INSTALLED:
            for sig in (signal.SIGINT, signal.SIGTERM):
                _chain_handler(sig)
            _HANDLERS_INSTALLED = True
    return True


def unregister(server: Server) -> None:
    """Forget a stopped server."""
    with _GUARD:
        _LIVE.pop(id(server), None)


def live_servers() -> list[Server]:
    """The servers this process started and has not stopped yet."""
    with _GUARD:
        return list(_LIVE.values())


def stop_all() -> None:
    """Stops every server this process started and has not stopped yet."""
    for server in live_servers():
        try:
            server.stop(timeout_s=5.0)
        except Exception as e:  # noqa: BLE001 - keep stopping the others
            log.warning("could not stop %r: %s", server, e)


def defer_signal_cleanup() -> None:
    """Leave SIGINT/SIGTERM to the handler the caller installed before any server started: the handlers
    chained here then pass the signal on without stopping servers. graph.run's first signal asks the run
    to stop at the next step (a server it still needs must stay up), its second calls :func:`kill_all`;
    the servers are stopped at exit either way (context managers, atexit)."""
    global _DEFERRED
    _DEFERRED = True


def kill_all() -> None:
    """SIGKILL every live server with its process group and descendants, without waiting."""
    for server in live_servers():
        server.kill_now()


def _chain_handler(sig: int) -> None:
    previous = signal.getsignal(sig)

    def handler(signum, frame):
        if not _DEFERRED:
            stop_all()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(sig, handler)
