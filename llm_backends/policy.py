"""The current policy checkpoint as a chat model, for the evaluate node and the self/base engineers.

``open_policy(checkpoint, backend, log_dir)`` yields a :class:`~llm_backends.base.ChatModel`:

- ``backend="transformers"``: :class:`~llm_backends.local.LocalEngine` in this process (works everywhere);
- ``backend="auto"``: ``vllm`` when vLLM is installed, else ``transformers``;
- ``backend="vllm"``: a :class:`~llm_backends.vllm_server.VLLMServer` started on the checkpoint (a LoRA adapter is
  served on its base model with runtime LoRA loading) and an :class:`~llm_backends.openai_chat.OpenAIChat` on it;
  the server is stopped on exit and its log kept in ``log_dir``.

A checkpoint is a folder with full weights or a LoRA adapter (``adapter_config.json``), a short name
(``smollm2-135m``) or a Hugging Face id; None means the embedded default policy.

Keeping one server across stages (``keep_server=True``): instead of a 40-90 s start per use, one vLLM
server stays up between uses and follows the checkpoint: new full weights of the same architecture are
loaded in place (``reload_weights``, about 0.6 s), a LoRA adapter is loaded under the requested name
(about 60 ms). An incompatible request (another architecture, LoRA on a server started without it)
replaces the server. The kept server is stopped at interpreter exit, on SIGINT/SIGTERM, or by
:func:`stop_kept_server`. The loop keeps it by default: its nodes pass ``Settings.keep_server``, which
defaults to True. Only a caller that passes ``keep_server=None`` (this function's default) gets the
environment's choice, ``LLM_KEEP_SERVER=1``, off when unset.

The kept server's log is the ``log_dir`` of the call that started it, for its whole life: later users
(other stages, the engineer) do not get their own log file. Each later use writes a ``=== ...`` line into
that log naming the checkpoint it serves, and a one-line pointer to that log into its own ``log_dir``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from llm_backends.base import ChatModel
from llm_backends.checkpoints import adapter_base, adapter_config
from llm_backends.models import DEFAULT_POLICY, resolve_model

BACKENDS = ("auto", "transformers", "vllm")
_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's --max-lora-rank accepts


@contextlib.contextmanager
def open_policy(
    checkpoint: str | os.PathLike | None = None,
    backend: str = "transformers",
    log_dir: str | os.PathLike | None = None,
    *,
    base_model: str | os.PathLike | None = None,
    batch_size: int = 8,
    max_concurrency: int = 16,
    keep_server: bool | None = None,
    enable_thinking: bool | None | object = ...,
    dtype: str | None = None,
) -> Iterator[ChatModel]:
    """A chat model answering with ``checkpoint``; everything it started is stopped on exit
    (except a kept server, see the module docstring).

    ``base_model`` is only used for a LoRA adapter whose config does not name a loadable base.
    ``keep_server``: True/False, or None to read ``LLM_KEEP_SERVER`` (off unless set to 1).
    ``dtype``: the vLLM server's weights dtype (Settings.policy_dtype, resolved); None: the server's default.
    """
    if backend not in BACKENDS:
        raise ValueError(f"policy backend {backend!r} is not one of {', '.join(BACKENDS)}")
    log_dir = Path(log_dir) if log_dir is not None else Path.cwd() / "logs"
    with open_checkpoint(
        checkpoint or DEFAULT_POLICY,
        backend=backend,
        log_path=log_dir / "policy-vllm.log",
        base_model=base_model,
        served_name="policy",
        batch_size=batch_size,
        max_concurrency=max_concurrency,
        keep_server=keep_server,
        enable_thinking=enable_thinking,
        dtype=dtype,
    ) as chat:
        yield chat


@contextlib.contextmanager
def open_checkpoint(
    weights: str | os.PathLike,
    *,
    backend: str,
    log_path: str | os.PathLike,
    base_model: str | os.PathLike | None = None,
    served_name: str = "policy",
    batch_size: int = 8,
    max_concurrency: int = 16,
    keep_server: bool | None = None,
    enable_thinking: bool | None | object = ...,
    dtype: str | None = None,
) -> Iterator[ChatModel]:
    """Shared by :func:`open_policy` and :func:`llm_backends.engineers.open_engineer`.

    ``enable_thinking``: the chat template's thinking switch for every request (vLLM: the request's
    ``chat_template_kwargs``; transformers: ``apply_chat_template``); None passes nothing; not given: the
    process's choice (:func:`set_enable_thinking`, which graph.run sets from ``train.enable_thinking``).
    """
    from llm_backends.vllm_server import resolve_backend

    if keep_server is None:
        keep_server = os.environ.get("LLM_KEEP_SERVER", "").lower() in ("1", "true", "yes")
    backend = resolve_backend(backend)  # Settings resolve `auto` at start; a direct caller gets the same rule
    template = template_kwargs(_THINKING["value"] if enable_thinking is ... else enable_thinking)
    path = resolve_model(weights)
    if backend == "transformers":
        from llm_backends.local import LocalEngine

        engine = LocalEngine(path, batch_size=batch_size, base_model=base_model, chat_template_kwargs=template)
        try:
            yield engine
        finally:
            engine.close()
        return
    if backend != "vllm":
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    from llm_backends.vllm_server import VLLMServer

    adapter = adapter_config(path)
    extra = {"extra_body": {"chat_template_kwargs": template}} if template else {}
    if keep_server:
        chat = _kept_client(path, adapter, log_path, base_model, served_name, max_concurrency, dtype, **extra)
        try:
            yield chat
        finally:
            chat.close()
        return
    if adapter is None:
        with VLLMServer(path, log_path=log_path, served_model_name=served_name, dtype=dtype) as server:
            chat = server.client(max_concurrency=max_concurrency, **extra)
            try:
                yield chat
            finally:
                chat.close()
        return
    base = adapter_base(path, base_model)
    with VLLMServer(base, log_path=log_path, enable_lora=True, max_lora_rank=lora_rank(adapter), dtype=dtype) as server:
        server.load_lora(served_name, path)
        chat = server.client(model=served_name, max_concurrency=max_concurrency, **extra)
        try:
            yield chat
        finally:
            chat.close()


_THINKING: dict = {"value": None}  # the process's enable_thinking (graph.run: the run's train.enable_thinking)


def set_enable_thinking(value: bool | None) -> None:
    """The thinking switch every later :func:`open_policy` / :func:`open_checkpoint` uses unless given one."""
    _THINKING["value"] = value


def template_kwargs(enable_thinking: bool | None) -> dict:
    """Chat-template arguments for a thinking switch: {} for None (the template's own default)."""
    return {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}


def lora_rank(adapter: dict) -> int:
    """The ``--max-lora-rank`` a vLLM server needs for ``adapter``: the smallest value vLLM accepts at or above
    its rank, at least 16."""
    rank = int(adapter.get("r") or 16)
    return max(16, next((r for r in _LORA_RANKS if r >= rank), rank))


# -- one kept server ------------------------------------------------------------------------------

_KEPT: dict = {}  # "server" -> VLLMServer, "weights" -> Path of the full weights it serves now
_ARCH_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "vocab_size")


def _arch(path: Path) -> tuple:
    cfg = json.loads((path / "config.json").read_text())
    return tuple(json.dumps(cfg.get(k), sort_keys=True) for k in _ARCH_KEYS)


def _kept_client(path, adapter, log_path, base_model, served_name, max_concurrency, dtype=None, **client_kw):
    from llm_backends.vllm_server import VLLMServer, resolve_serving_dtype

    weights = path if adapter is None else adapter_base(path, base_model)
    server = _KEPT.get("server")
    usable = (
        server is not None
        and server.running
        and _arch(server.model_path) == _arch(weights)
        and (dtype is None or server.dtype == resolve_serving_dtype(dtype))  # "auto" as the server resolved it
        and (adapter is None or (server.enable_lora and server.max_lora_rank >= lora_rank(adapter)))
    )
    if not usable:
        stop_kept_server()
        server = VLLMServer(weights, log_path=log_path, enable_lora=True,
                            max_lora_rank=lora_rank(adapter or {}), served_model_name="kept", dtype=dtype).start()
        _KEPT.update(server=server, weights=weights)
    else:
        # the kept server logs to its first caller's file: mark where this use starts, and leave a pointer
        # in the file this caller would have used
        server.note(f"now serving {served_name if adapter is not None else server.model_name}: {path}")
        _point_to(Path(log_path), server)
        if Path(_KEPT["weights"]) != weights:
            server.reload_weights(weights)
            _KEPT["weights"] = weights
    if adapter is None:
        return server.client(max_concurrency=max_concurrency, **client_kw)
    server.load_lora(served_name, path)
    return server.client(model=served_name, max_concurrency=max_concurrency, **client_kw)


def _point_to(log_path: Path, server) -> None:
    if log_path.resolve() == server.log_path.resolve():
        return
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(f"served by the kept vLLM server on {server.base_url}; its log is {server.log_path}\n")
    except OSError:
        pass  # a pointer is a courtesy, not a reason to fail the stage


def release_gpu_for_training() -> bool:
    """Before a stage trains: stop the kept server when it runs on a GPU build, so that it does not hold its
    share of the GPU while the trainer (and TRL's colocated vLLM) needs all of it. The next evaluation starts
    a new server. On the CPU build the kept server stays (it holds no GPU; a restart costs 40-90 s there).
    Returns True when a server was stopped."""
    from llm_backends.vllm_server import is_cpu_build

    server = _KEPT.get("server")
    if server is None or is_cpu_build():
        return False
    stop_kept_server()
    return True


def stop_kept_server() -> None:
    """Stops the server kept by ``keep_server=True`` (if any)."""
    server = _KEPT.pop("server", None)
    _KEPT.pop("weights", None)
    if server is not None:
        server.stop()
