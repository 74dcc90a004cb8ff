"""OpenAIChat: the chat interface on any OpenAI-compatible endpoint (vLLM, OpenAI, Gemini, others).

The ``openai`` client does the HTTP with its own retries switched off (``max_retries=0``); tenacity does
the retrying, so that one policy covers every backend: exponential back-off with jitter on timeouts,
connection errors, 429, 5xx and garbled bodies, a server's ``Retry-After`` honoured (capped by what is left
of the budget), and a total time budget per call after which one :class:`~llm.base.ChatError` names the
backend and the last cause. Other 4xx answers are not retried.

Servers differ in what they accept; the client learns once per instance and remembers:
- ``json_schema`` goes out as ``response_format={"type": "json_schema", ...}``; a 400 that names
  ``response_format`` / ``json_schema`` switches to the schema in the prompt plus JSON extraction;
- a 400 that rejects ``temperature`` (OpenAI's reasoning models) drops it;
- a 400 that asks for ``max_completion_tokens`` instead of ``max_tokens`` switches the name.

The API key is only handed to the ``openai`` client. It never appears in ``repr``, in log records or in
exception messages: every message that leaves this module is passed through :meth:`OpenAIChat._redact`.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay

from llm.base import ChatError, ChatResult, Messages, UsageStats, extract_json, with_schema_in_prompt

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529}


class _Retryable(Exception):
    """An attempt that failed in a way worth trying again; ``cause`` is the one-line reason."""

    def __init__(self, cause: str, retry_after: float | None = None):
        super().__init__(cause)
        self.cause = cause
        self.retry_after = retry_after


class _Fatal(Exception):
    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


class OpenAIChat:
    """A :class:`~llm.base.ChatModel` on an OpenAI-compatible ``base_url``.

    Args:
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
        model: model name sent with each request.
        api_key: the key; ``None`` sends a placeholder (local servers need none).
        backend: the name used in errors and logs (``openai``, ``gemini``, ``vllm``, a custom name).
        timeout_s: limit for one HTTP attempt, in seconds.
        total_budget_s: limit for one call, retries and back-off included, in seconds.
        max_concurrency: threads used by :meth:`chat_batch`.
        max_attempts: attempts per call at most (the budget usually stops it first).
        backoff_initial_s / backoff_max_s: exponential back-off start and cap, in seconds.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        backend: str = "openai",
        timeout_s: float = 120.0,
        total_budget_s: float = 600.0,
        max_concurrency: int = 8,
        *,
        max_attempts: int = 10,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.total_budget_s = float(total_budget_s)
        self.max_concurrency = max(1, int(max_concurrency))
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._secret = api_key or ""
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=self.timeout_s
        )
        self.stats = UsageStats()
        self._lock = threading.Lock()
        # what this server was found to reject; learnt once, kept for the instance's life
        self.supports_json_schema = True
        self.send_temperature = True
        self.max_tokens_param = "max_tokens"

    def __repr__(self) -> str:
        return f"OpenAIChat(backend={self.backend!r}, base_url={self.base_url!r}, model={self.model!r})"

    # -- public interface -------------------------------------------------------------------------

    def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
    ) -> ChatResult:
        start = time.monotonic()
        attempts = 0
        last_cause = ""

        def attempt() -> ChatResult:
            nonlocal attempts, last_cause
            attempts += 1
            try:
                return self._attempt(messages, max_tokens, temperature, json_schema, start)
            except _Retryable as e:
                if e.cause.startswith("time budget"):  # nothing was sent: not an attempt
                    attempts -= 1
                    if last_cause:
                        raise _Retryable(f"{last_cause}; then the {e.cause}") from None
                last_cause = e.cause
                raise

        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
            stop=stop_after_attempt(self.max_attempts) | stop_after_delay(self.total_budget_s) | self._retry_after_past_budget,
            wait=self._wait,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            result = retrying(attempt)
        except (_Retryable, _Fatal) as e:
            with self._lock:
                self.stats.failures += 1
            raise ChatError(
                self.backend, self._redact(e.cause), attempts=attempts, elapsed_s=time.monotonic() - start
            ) from None
        result = ChatResult(
            text=result.text,
            latency_s=time.monotonic() - start,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            model=result.model,
            parsed=result.parsed,
            attempts=attempts,
            finish_reason=result.finish_reason,
        )
        with self._lock:
            self.stats.add(result)
        return result

    def chat_batch(
        self,
        batch: list[Messages],
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
    ) -> list[ChatResult]:
        """Answers in input order; at most ``max_concurrency`` requests in flight. The first failure raises."""
        if not batch:
            return []
        kw = dict(max_tokens=max_tokens, temperature=temperature, json_schema=json_schema)
        if len(batch) == 1 or self.max_concurrency == 1:
            return [self.chat(m, **kw) for m in batch]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(batch))) as pool:
            futures = [pool.submit(self.chat, m, **kw) for m in batch]
            return [f.result() for f in futures]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIChat:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one HTTP attempt -------------------------------------------------------------------------

    def _attempt(self, messages, max_tokens, temperature, json_schema, start) -> ChatResult:
        left = self.total_budget_s - (time.monotonic() - start)
        if left <= 0:
            raise _Retryable(f"time budget of {self.total_budget_s:.0f}s spent")
        use_schema = json_schema is not None and self.supports_json_schema
        msgs = messages if (json_schema is None or use_schema) else with_schema_in_prompt(messages, json_schema)
        body: dict = {"model": self.model, "messages": msgs, self.max_tokens_param: max_tokens}
        if self.send_temperature:
            body["temperature"] = temperature
        if use_schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": _schema_name(json_schema), "schema": json_schema},
            }
        t0 = time.monotonic()
        try:
            resp = self._client.chat.completions.create(**body, timeout=min(self.timeout_s, left))
        except openai.APITimeoutError:
            raise _Retryable(f"timeout: no answer within {min(self.timeout_s, left):.1f}s") from None
        except openai.APIConnectionError as e:
            raise _Retryable(f"connection error ({_root_cause(e)})") from None
        except openai.APIStatusError as e:
            status = e.status_code
            detail = _error_detail(e)
            if status in RETRYABLE_STATUS or status >= 500:
                what = "rate limited" if status == 429 else "server error"
                raise _Retryable(f"HTTP {status} {what}: {detail}", _retry_after(e.response)) from None
            if status == 400 and self._adapt(detail, json_schema is not None):
                # the server told us what it does not accept: retry at once with the adapted request
                return self._attempt(messages, max_tokens, temperature, json_schema, start)
            raise _Fatal(f"HTTP {status}: {detail}") from None
        except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as e:
            raise _Retryable(f"malformed response body ({type(e).__name__})") from None
        if not getattr(resp, "choices", None):
            raise _Retryable("malformed response: no choices")
        choice = resp.choices[0]
        text = (choice.message.content if choice.message is not None else None) or ""
        usage = getattr(resp, "usage", None)
        parsed = extract_json(text) if json_schema is not None else None
        log.debug(
            "%s %s answered in %.2fs (%s tokens)",
            self.backend,
            self.model,
            time.monotonic() - t0,
            getattr(usage, "completion_tokens", "?"),
        )
        return ChatResult(
            text=text,
            latency_s=time.monotonic() - t0,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            model=getattr(resp, "model", None) or self.model,
            parsed=parsed,
            finish_reason=getattr(choice, "finish_reason", None),
        )

    def _adapt(self, detail: str, asked_schema: bool) -> bool:
        """Learn from a 400 what this server rejects; True when the request changed and is worth resending."""
        d = detail.lower()
        with self._lock:
            if asked_schema and self.supports_json_schema and ("response_format" in d or "json_schema" in d):
                log.info("%s rejects response_format json_schema; using the schema in the prompt", self.backend)
                self.supports_json_schema = False
                self.stats.schema_fallbacks += 1
                return True
            if self.send_temperature and "temperature" in d:
                self.send_temperature = False
                return True
            if self.max_tokens_param == "max_tokens" and "max_completion_tokens" in d:
                self.max_tokens_param = "max_completion_tokens"
                return True
        return False

    # -- tenacity hooks ---------------------------------------------------------------------------

    def _wait(self, state: RetryCallState) -> float:
        n = state.attempt_number
        backoff = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (n - 1))
        backoff *= 0.5 + 0.5 * _jitter()
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            backoff = exc.retry_after
        left = self.total_budget_s - state.seconds_since_start
        return max(0.0, min(backoff, left))

    def _retry_after_past_budget(self, state: RetryCallState) -> bool:
        """Give up at once, with the server's cause, when it asks us to wait past the budget."""
        exc = state.outcome.exception() if state.outcome else None
        ra = getattr(exc, "retry_after", None)
        return ra is not None and state.seconds_since_start + ra > self.total_budget_s

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        cause = self._redact(getattr(exc, "cause", str(exc)))
        sleep = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s: attempt %d failed (%s); retrying in %.1fs", self.backend, state.attempt_number, cause, sleep)

    def _redact(self, text: str) -> str:
        if self._secret and len(self._secret) >= 4:
            text = text.replace(self._secret, "***")
        return text


def _jitter() -> float:
    import random

    return random.random()


def _schema_name(schema: dict) -> str:
    title = str(schema.get("title") or "answer")
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in title)
    return name[:64] or "answer"


def _retry_after(response) -> float | None:
    """Seconds from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date), or None."""
    if response is None:
        return None
    headers = response.headers
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _error_detail(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        err = body.get("error")
        msg = (err.get("message") if isinstance(err, dict) else None) or body.get("message")
        if msg:
            return str(msg)[:300]
    try:
        text = e.response.text
    except Exception:  # noqa: BLE001 - a body that cannot be read is no reason to hide the status
        text = ""
    return (text or str(e.message))[:300]


def _root_cause(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return type(e).__name__
