"""Engineer backends, chosen by name (``ENGINEER``) and environment variables.

========  ======================================================================================
kind      what answers
========  ======================================================================================
self      the current policy checkpoint: a vLLM server on it (LoRA adapters on their base), or
          :class:`~llm_backends.local.LocalEngine` in-process when vLLM is not installed
base      the same, on the base model (``base_model``; default the embedded SmolLM2-135M)
openai    ``https://api.openai.com/v1``, model ``ENGINEER_MODEL`` or :data:`DEFAULTS` ("gpt-5.4", the
          paper's GPT engineer); key ``ENGINEER_API_KEY`` or ``OPENAI_API_KEY``
gemini    Gemini's OpenAI-compatible endpoint (no extra SDK), model ``ENGINEER_MODEL`` or
          "gemini-3.1-pro-preview" (the paper's Gemini-3.1-Pro); key ``ENGINEER_API_KEY`` or ``GEMINI_API_KEY``
<name>    any OpenAI-compatible endpoint: ``ENGINEER_BASE_URL`` + ``ENGINEER_MODEL`` (both required);
          key ``ENGINEER_API_KEY``, else ``OPENAI_API_KEY``, else ``GEMINI_API_KEY``, else none (local servers)
========  ======================================================================================

``fixed``, ``random``, ``learnability``, ``threshold`` and ``rlve`` (RLVE's rule) are engineers without a model (nodes/ runs them):
:func:`check_engineer_env` accepts them and returns None; :func:`open_engineer` refuses them.

Reply limits (:func:`reply_tokens`). The self and base engineers answer with the embedded model's JSON and
get the run's ``engineer_max_tokens`` (the preset's, 384 to 2,048). An API engineer gets
``engineer_api_max_tokens``, else its backend's :data:`REPLY_TOKENS`: the default openai and gemini models are
reasoning models, which count their reasoning against the limit and may think for thousands of tokens before a
short config. An empty reply, or one cut at its limit, is asked again once with :data:`GROWTH` times the limit,
up to the most the backend allows one reply (:mod:`llm_backends.replies`). ``engineer_reasoning_effort``, when
set, goes to an API engineer as ``reasoning_effort``.

Everything is checked before any work: :func:`check_engineer_env` (also called first by
:func:`open_engineer`) raises :class:`EngineerConfigError` with one line saying what is wrong and what to
set. Keys are read from ``env`` only, handed to the client and never written anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llm_backends.base import ChatModel
from llm_backends.models import DEFAULT_POLICY
from llm_backends.redact import mask_url

log = logging.getLogger(__name__)

MODEL_ENGINEERS = ("self", "base", "openai", "gemini")
CLASSIC_ENGINEERS = ("fixed", "random", "learnability", "threshold", "rlve")

# kind -> (base URL, default model, key variables tried after ENGINEER_API_KEY)
DEFAULTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "openai": ("https://api.openai.com/v1", "gpt-5.4", ("OPENAI_API_KEY",)),
    "gemini": (
        "https://generativelanguage.googleapis.com/v1beta/openai/",
        "gemini-3.1-pro-preview",
        ("GEMINI_API_KEY",),
    ),
}


# kind -> (the token limit of one reply, the most the API allows one reply): room for a reasoning model's thinking
REPLY_TOKENS: dict[str, tuple[int, int | None]] = {
    "openai": (16_384, 128_000),
    "gemini": (16_384, 65_536),
}
# any other OpenAI-compatible endpoint: a limit that fits a reasoning model on a local server; its most unknown
ENDPOINT_REPLY_TOKENS: tuple[int, int | None] = (8_192, None)
GROWTH = 4  # an empty or cut reply is asked again once with this many times the limit (capped by the most)


def reply_tokens(kind: str, self_limit: int, api_limit: int | None = None) -> tuple[int, int]:
    """(the token limit of one reply of engineer `kind`, the larger limit an empty or cut reply is asked again
    with; equal when the backend allows no more). `self_limit`: the self/base engineers' (the run's
    engineer_max_tokens); `api_limit`: an API engineer's (engineer_api_max_tokens), None for its backend's.

    >>> reply_tokens("self", 384), reply_tokens("openai", 384), reply_tokens("gemini", 65_536, 65_536)
    ((384, 1536), (16384, 65536), (65536, 65536))
    """
    if kind in ("self", "base"):
        limit, most = self_limit, None
    else:
        default, most = REPLY_TOKENS.get(kind, ENDPOINT_REPLY_TOKENS)
        limit = api_limit or default
        if most is not None:
            limit = min(limit, most)
    larger = limit * GROWTH
    return limit, larger if most is None else min(larger, most)


class EngineerConfigError(ValueError):
    """A bad engineer choice or missing setting, found before any work started (one line)."""


@dataclass(frozen=True)
class EngineerSpec:
    """What :func:`check_engineer_env` resolved. ``api_key`` is hidden from ``repr``."""

    kind: str
    backend: str  # "vllm" | "transformers" for self/base; "http" for endpoints
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    key_source: str | None = None  # the variable the key came from (never the key)

    def describe(self) -> str:
        if self.backend == "http":
            src = f", key from ${self.key_source}" if self.key_source else ", no key"
            return f"{self.kind}: {self.model} at {mask_url(self.base_url)}{src}"
        return f"{self.kind}: {self.backend}"


def check_engineer_env(
    kind: str,
    env: Mapping[str, str] | None = None,
    *,
    model: str | None = None,
    base_url: str | None = None,
) -> EngineerSpec | None:
    """Validates ``kind`` against ``env`` (default ``os.environ``) without starting anything.

    ``model`` / ``base_url`` (from CLI flags or settings) win over ``ENGINEER_MODEL`` / ``ENGINEER_BASE_URL``.

    Returns the resolved :class:`EngineerSpec`, or None for an engineer without a model (``fixed`` ...).
    Raises :class:`EngineerConfigError` for an unknown kind or a missing URL/model/key.
    """
    env = os.environ if env is None else env
    kind = (kind or "").strip()
    if not kind:
        raise EngineerConfigError("ENGINEER is empty: choose " + _choices())
    if kind in CLASSIC_ENGINEERS:
        return None
    if kind in ("self", "base"):
        backend = env.get("ENGINEER_SERVING", "auto")
        if backend not in ("auto", "vllm", "transformers"):
            raise EngineerConfigError(f"ENGINEER_SERVING={backend!r} is not one of auto, vllm, transformers")
        from llm_backends.vllm_server import resolve_backend

        return EngineerSpec(kind=kind, backend=resolve_backend(backend))

    overrides = {"ENGINEER_MODEL": model, "ENGINEER_BASE_URL": base_url}

    def get(name: str) -> str:
        return (overrides.get(name) or env.get(name) or "").strip()

    if kind in DEFAULTS:
        base_url, default_model, fallbacks = DEFAULTS[kind]
        base_url = get("ENGINEER_BASE_URL") or base_url
        model = get("ENGINEER_MODEL") or default_model
        key, source = _key(get, fallbacks)
        if not key:
            names = " or ".join(("ENGINEER_API_KEY",) + fallbacks)
            raise EngineerConfigError(f"ENGINEER={kind} needs an API key: set {names}")
        return EngineerSpec(kind, "http", base_url, model, key, source)
    # a custom name: an OpenAI-compatible endpoint described by the environment
    base_url, model = get("ENGINEER_BASE_URL"), get("ENGINEER_MODEL")
    if not base_url:
        raise EngineerConfigError(
            f"unknown engineer {kind!r}: choose {_choices()}, or set ENGINEER_BASE_URL and ENGINEER_MODEL "
            f"to use {kind!r} as the name of an OpenAI-compatible endpoint"
        )
    if not base_url.startswith(("http://", "https://")):
        raise EngineerConfigError(
            f"ENGINEER_BASE_URL must start with http:// or https:// (got {mask_url(base_url)[:60]!r})"
        )
    if not model:
        raise EngineerConfigError(f"ENGINEER={kind} with ENGINEER_BASE_URL set also needs ENGINEER_MODEL")
    key, source = _key(get, ("OPENAI_API_KEY", "GEMINI_API_KEY"))
    return EngineerSpec(kind, "http", base_url, model, key or None, source)


def _key(get, fallbacks: tuple[str, ...]) -> tuple[str, str | None]:
    for name in ("ENGINEER_API_KEY", *fallbacks):
        if get(name):
            return get(name), name
    return "", None


def _choices() -> str:
    return "|".join(MODEL_ENGINEERS + CLASSIC_ENGINEERS) + "|<custom name>"


@contextlib.contextmanager
def open_engineer(
    kind: str,
    *,
    checkpoint: str | os.PathLike | None = None,
    base_model: str | os.PathLike | None = None,
    run_dir: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    model: str | None = None,
    base_url: str | None = None,
    keep_server: bool | None = None,
    dtype: str | None = None,
    timeout_s: float = 300.0,
    total_budget_s: float = 1800.0,
    max_concurrency: int = 4,
    reasoning_effort: str | None = None,
) -> Iterator[ChatModel]:
    """A chat model for engineer ``kind``, closed (servers stopped) on exit.

    Args:
        checkpoint: the current policy checkpoint (``self``); None means the base model.
        base_model: the policy's base model (``base``, and the base of a LoRA checkpoint); default
            the embedded SmolLM2-135M.
        run_dir: where a started server writes its log (``<run_dir>/logs/engineer-<kind>-vllm.log``).
        env: environment to read (default ``os.environ``).
        model / base_url: override ``ENGINEER_MODEL`` / ``ENGINEER_BASE_URL`` (CLI flags, settings).
        keep_server: self/base on vLLM: keep one server up across calls and load new weights into it.
            None (the default here) reads ``LLM_KEEP_SERVER`` (off unless set to 1); the loop passes
            ``Settings.keep_server``, which is True by default. The kept server logs to the file of the
            call that started it; see :mod:`llm_backends.policy`.
        dtype: self/base on vLLM: the server's weights dtype (Settings.policy_dtype: the policy's own server,
            so a kept server is shared with the evaluation); None: the server's default.
        timeout_s / total_budget_s / max_concurrency: passed to :class:`~llm_backends.openai_chat.OpenAIChat`.
        reasoning_effort: an API engineer's ``reasoning_effort`` (None: not sent); the self/base engineers
            ignore it.
    """
    spec = check_engineer_env(kind, env, model=model, base_url=base_url)
    if spec is None:
        raise EngineerConfigError(f"ENGINEER={kind} has no model to open: nodes/ runs it without an LLM")
    if spec.backend == "http":
        from llm_backends.openai_chat import OpenAIChat

        log.info("engineer %s", spec.describe())
        chat = OpenAIChat(
            spec.base_url,
            spec.model,
            api_key=spec.api_key,
            backend=spec.kind,
            timeout_s=timeout_s,
            total_budget_s=total_budget_s,
            max_concurrency=max_concurrency,
            reasoning_effort=reasoning_effort,
        )
        try:
            yield chat
        finally:
            chat.close()
        return
    base = base_model or DEFAULT_POLICY
    weights = checkpoint if (spec.kind == "self" and checkpoint) else base
    log_dir = Path(run_dir) / "logs" if run_dir else Path.cwd() / "logs"
    from llm_backends.policy import open_checkpoint

    with open_checkpoint(
        weights,
        backend=spec.backend,
        log_path=log_dir / f"engineer-{spec.kind}-vllm.log",
        base_model=base,
        served_name=f"engineer-{spec.kind}",
        keep_server=keep_server,
        dtype=dtype,
    ) as chat:
        yield chat
