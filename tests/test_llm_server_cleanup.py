"""No vLLM process outlives the run, and retries stop on a dead server, fast: the server
processes are stand-ins (python scripts), the cleanup code is the real one.

- `VLLMServer.stop()` kills a descendant that left the server's process group (an engine core in a
  session of its own), which a process-group kill alone misses;
- the launcher's watchdog (`llm_backends.vllm_launch.watch_parent`) kills the server's group and descendants once
  its parent is gone (SIGKILL), instead of vLLM's minutes-long SIGTERM shutdown;
- a client of a server whose process died gets one error at once, not retries for its whole budget.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llm_backends.base import ChatError
from llm_backends.vllm_server import VLLMServer, free_port

ROOT = Path(__file__).resolve().parents[1]

# a "server" whose child leaves the process group (setsid), prints its pid and sleeps
SERVER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(300)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"  # a zombie is dead
    except (OSError, IndexError):
        return False


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def fake_server(tmp_path: Path) -> VLLMServer:
    server = VLLMServer(tmp_path, log_path=tmp_path / "vllm.log", port=free_port())
    return server


def test_stop_kills_a_descendant_that_left_the_process_group(tmp_path):
    server = fake_server(tmp_path)
    server._proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
                                    start_new_session=True)
    child = int(server._proc.stdout.readline())
    try:
        assert alive(child)
        server.stop(timeout_s=5)
        assert wait_dead(child), "the engine-core stand-in outlived its server"
    finally:
        if alive(child):
            os.kill(child, 9)


def test_launcher_watchdog_kills_the_group_when_its_parent_dies(tmp_path):
    """parent -> launcher stand-in (own session, running the real watchdog) -> child that left the group."""
    launcher = textwrap.dedent("""
        import os, subprocess, sys, threading, time
        from llm_backends.vllm_launch import watch_parent
        parent = os.getppid()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        print(os.getpid(), child.pid, flush=True)
        watch_parent(parent, period_s=0.1)
    """)
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", {launcher!r}], start_new_session=True, stdout=sys.stdout)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})  # the launcher imports llm_backends
    launcher_pid, child = map(int, parent.stdout.readline().split())
    try:
        assert alive(launcher_pid) and alive(child)
        parent.kill()
        parent.wait()
        assert wait_dead(launcher_pid) and wait_dead(child), "the server outlived the process that started it"
    finally:
        for pid in (launcher_pid, child):
            if alive(pid):
                os.kill(pid, 9)


def test_retries_stop_as_soon_as_the_kept_server_is_dead(tmp_path):
    server = fake_server(tmp_path)  # nothing listens on its port: every attempt is a connection error
    server._proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    server._proc.wait()
    chat = server.client(timeout_s=5, total_budget_s=120)
    t0 = time.monotonic()
    with pytest.raises(ChatError) as e:
        chat.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    assert time.monotonic() - t0 < 10, "retried a dead server"
    assert "not retried" in str(e.value) and "exited with code 0" in str(e.value)
    assert e.value.attempts == 1
    server._proc = None
