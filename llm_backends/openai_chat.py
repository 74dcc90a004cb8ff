"""OpenAIChat: the chat interface on any OpenAI-compatible endpoint (vLLM, OpenAI, Gemini, others).

The ``openai`` client does the HTTP with its own retries switched off (``max_retries=0``); tenacity does
the retrying, so that one policy covers every backend: exponential back-off with jitter on timeouts,
connection errors, 429, 5xx and garbled bodies, a server's ``Retry-After`` honoured (capped by what is left
of the budget), and a total time budget per call after which one :class:`~llm_backends.base.ChatError` names the
backend and the last cause. Other 4xx answers are not retried.

Servers differ in what they accept; the client learns once per instance and remembers:
- ``json_schema`` goes out as ``response_format={"type": "json_schema", ...}``; a 400/422 that names
  ``schema`` / ``response_format`` / ``response_schema`` / ``generation_config``, or says "not supported"
  / "unsupported", steps down to ``{"type": "json_object"}`` with the schema in the prompt, and a second
  such rejection to the schema in the prompt alone; the reply's first JSON value is extracted either way;
- a 400/422 that rejects ``temperature`` (OpenAI's reasoning models) drops it;
- a 400/422 that asks for ``max_completion_tokens`` instead of ``max_tokens`` switches the name, and one that says
  the limit is past what the model allows (its context, less the prompt) asks again with what it allows;
- a 400/422 that rejects ``reasoning_effort`` (sent only when set) drops it, with a warning.

:meth:`OpenAIChat.chat_batch` fails fast: the first request that fails for good raises at once, requests
not yet sent are cancelled and those in flight are not retried; an optional deadline bounds the batch.

The API key is only handed to the ``openai`` client. It never appears in ``repr``, in log records or in
exception messages: every message that leaves this module is passed through :meth:`OpenAIChat._redact`,
which masks the key, fragments of it and anything shaped like a key (``sk-...``, ``AIza...``, masked
echoes such as ``sk-abc****5678``); a 401/403 reports "authentication failed" without the server's text.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FutureTimeout

import openai
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay

from llm_backends.base import ChatError, ChatResult, Messages, UsageStats, extract_json, with_schema_in_prompt
from llm_backends.redact import mask_url, redact, split_query
from llm_backends.replies import fitting_limit, reasoning_field, split_reasoning

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529}
AUTH_HINT = "check ENGINEER_API_KEY / OPENAI_API_KEY / GEMINI_API_KEY"
# words in a 400/422 that mean "this server does not take response_format as sent"
_SCHEMA_WORDS = ("schema", "response_format", "response_schema", "generation_config", "json_object")
_UNSUPPORTED_WORDS = ("not supported", "unsupported")
# what json_schema asks of the server, best first: enforced schema, JSON mode, the schema in the prompt
SCHEMA_MODES = ("json_schema", "json_object", "prompt")


class _Retryable(Exception):
    """An attempt that failed in a way worth trying again; ``cause`` is the one-line reason.

    ``unsent``: nothing went out (the budget was spent before the attempt), so it is no attempt."""

    def __init__(self, cause: str, retry_after: float | None = None, *, unsent: bool = False):
        super().__init__(cause)
        self.cause = cause
        self.retry_after = retry_after
        self.unsent = unsent


class _Fatal(Exception):
    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


class _Cancelled(_Fatal):
    """Another request of the same batch failed; this one stops before its next attempt."""


class OpenAIChat:
    """A :class:`~llm_backends.base.ChatModel` on an OpenAI-compatible ``base_url``.

    Args:
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
        model: model name sent with each request.
        api_key: the key; ``None`` sends a placeholder (local servers need none).
        backend: the name used in errors and logs (``openai``, ``gemini``, ``vllm``, a custom name).
        timeout_s: limit for one HTTP attempt, in seconds.
        total_budget_s: limit for one call, retries and back-off included, in seconds.
        max_concurrency: threads used by :meth:`chat_batch`.
        batch_deadline_s: limit for a whole :meth:`chat_batch`, in seconds; None: only each call's budget.
        max_attempts: attempts per call at most (the budget usually stops it first).
        backoff_initial_s / backoff_max_s: exponential back-off start and cap, in seconds.
        extra_body: fields added to every request body (vLLM: ``{"chat_template_kwargs": {...}}``).
        reasoning_effort: sent as ``reasoning_effort`` (OpenAI's ``minimal`` ... ``high``, Gemini's) when set; None
            sends nothing (the API's own default).
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
        batch_deadline_s: float | None = None,
        max_attempts: int = 10,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        server_check: Callable[[], str | None] | None = None,
        extra_body: dict | None = None,
        reasoning_effort: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.total_budget_s = float(total_budget_s)
        self.max_concurrency = max(1, int(max_concurrency))
        self.batch_deadline_s = batch_deadline_s
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.server_check = server_check
        # sent with every request, e.g. {"chat_template_kwargs": {"enable_thinking": False}} to a vLLM server
        self.extra_body = dict(extra_body) if extra_body else None
        self.reasoning_effort = reasoning_effort
        self._secret = api_key or ""
        # a query in the base URL (`.../v1?api_key=...`, Azure's `?api-version=...`) goes with every request as
        # parameters: appended to the base URL as text it would end up before the path (`/v1/?api_key=...chat/...`)
        root, query = split_query(self.base_url)
        self._client = openai.OpenAI(
            base_url=root, api_key=api_key or "EMPTY", max_retries=0, timeout=self.timeout_s,
            default_query=query or None,
        )
        # query values are masked like a key wherever a message could quote them
        self._query_secrets = [v for v in query.values() if len(v) >= 4]
        self.stats = UsageStats()
        self._lock = threading.Lock()
        # what this server was found to reject; learnt once, kept for the instance's life
        self.schema_mode = SCHEMA_MODES[0]
        self.send_temperature = True
        self.max_tokens_param = "max_tokens"
        self.max_tokens_cap: int | None = None  # the most this server took for a reply (learnt from a 400)
        self.send_reasoning_effort = reasoning_effort is not None

    @property
    def supports_json_schema(self) -> bool:
        """False once the server rejected ``response_format`` of type ``json_schema``."""
        return self.schema_mode == "json_schema"

    def __repr__(self) -> str:
        return f"OpenAIChat(backend={self.backend!r}, base_url={mask_url(self.base_url)!r}, model={self.model!r})"

    # -- public interface -------------------------------------------------------------------------

    def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
    ) -> ChatResult:
        return self._chat(messages, max_tokens, temperature, json_schema, self.total_budget_s)

    def chat_batch(
        self,
        batch: list[Messages],
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
        deadline_s: float | None = None,
    ) -> list[ChatResult]:
        """Answers in input order; at most ``max_concurrency`` requests in flight.

        Fails fast: the first request that fails for good raises its :class:`~llm_backends.base.ChatError` at once;
        requests not yet sent are never sent and those in flight are not retried (their threads end with
        their current HTTP attempt). ``deadline_s`` (default ``batch_deadline_s``) bounds the whole batch:
        each call's budget is cut to what is left of it, and a batch still unanswered at the deadline
        raises a ChatError saying how many answers had arrived.
        """
        if not batch:
            return []
        deadline_s = self.batch_deadline_s if deadline_s is None else deadline_s
        t0 = time.monotonic()
        deadline = None if deadline_s is None else t0 + deadline_s
        abort = threading.Event()
        failed: list[ChatError] = []  # the batch's own failure, never a request it cancelled because of it
        results: list[ChatResult | None] = [None] * len(batch)

        def one(messages: Messages) -> ChatResult:
            budget = self.total_budget_s
            if deadline is not None:
                budget = min(budget, deadline - time.monotonic())
            try:
                return self._chat(messages, max_tokens, temperature, json_schema, budget, abort)
            except ChatError as e:
                if not abort.is_set():
                    failed.append(e)
                abort.set()  # before this future completes: no later request of the batch goes out
                raise

        def deadline_error(cause: str | None, attempts: int = 0) -> ChatError:
            done = sum(r is not None for r in results)
            what = f"batch deadline of {deadline_s:g}s reached with {done} of {len(batch)} answers"
            return ChatError(self.backend, what + (f" (last: {cause})" if cause else ""), attempts=attempts,
                             elapsed_s=time.monotonic() - t0)

        def past_deadline() -> bool:
            return deadline is not None and time.monotonic() >= deadline - 0.05

        workers = min(self.max_concurrency, len(batch))
        if workers == 1:
            for i, m in enumerate(batch):
                try:
                    results[i] = one(m)
                except ChatError as e:
                    raise (deadline_error(e.cause, e.attempts) if past_deadline() else e) from None
            return results  # type: ignore[return-value]
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"chat-{self.backend}")
        try:
            futures = {pool.submit(one, m): i for i, m in enumerate(batch)}
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            for f in as_completed(futures, timeout=timeout):
                results[futures[f]] = f.result()
        except FutureTimeout:
            abort.set()
            raise deadline_error(None) from None
        except ChatError as e:
            # futures finished together come out of as_completed in any order: name the cause, not a cancellation
            e = failed[0] if failed else e
            raise (deadline_error(e.cause, e.attempts) if past_deadline() else e) from None
        finally:
            # never wait for the stragglers: cancel what has not started, let in-flight attempts end alone
            pool.shutdown(wait=False, cancel_futures=True)
        return results  # type: ignore[return-value]

    def _chat(self, messages, max_tokens, temperature, json_schema, budget_s: float,
              abort: threading.Event | None = None) -> ChatResult:
        """One call within ``budget_s`` seconds; ``abort`` (a batch's) stops it before its next attempt."""
        start = time.monotonic()
        attempts = 0
        last_cause = ""

        def attempt() -> ChatResult:
            nonlocal attempts, last_cause
            if abort is not None and abort.is_set():
                raise _Cancelled("cancelled: another request of the batch failed")
            attempts += 1
            try:
                return self._attempt(messages, max_tokens, temperature, json_schema, start, budget_s)
            except _Retryable as e:
                if e.unsent:  # nothing was sent: not an attempt
                    attempts -= 1
                    if last_cause:
                        raise _Retryable(f"{last_cause}; then the {e.cause}") from None
                last_cause = e.cause
                gone = self.server_check() if self.server_check is not None else None
                if gone:  # the server process is dead: no retry can succeed
                    raise _Fatal(f"{e.cause}; not retried: {gone}") from None
                raise

        def retry_after_past_budget(state: RetryCallState) -> bool:
            """Give up at once, with the server's cause, when it asks us to wait past the budget."""
            exc = state.outcome.exception() if state.outcome else None
            ra = getattr(exc, "retry_after", None)
            return ra is not None and state.seconds_since_start + ra > budget_s

        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
            stop=stop_after_attempt(self.max_attempts) | stop_after_delay(max(0.0, budget_s)) | retry_after_past_budget,
            wait=lambda state: self._wait(state, budget_s),
            # a batch that failed wakes its back-off sleepers at once
            sleep=time.sleep if abort is None else abort.wait,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            result = retrying(attempt)
        except (_Retryable, _Fatal) as e:
            if not isinstance(e, _Cancelled):  # the batch's failure is counted once, by its own call
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
            reasoning=result.reasoning,
        )
        with self._lock:
            self.stats.add(result)
        return result

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIChat:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one HTTP attempt -------------------------------------------------------------------------

    def _attempt(self, messages, max_tokens, temperature, json_schema, start, budget_s) -> ChatResult:
        left = budget_s - (time.monotonic() - start)
        if left <= 0:
            raise _Retryable(f"time budget of {budget_s:.3g}s spent", unsent=True)
        mode = self.schema_mode if json_schema is not None else None
        msgs = messages if mode in (None, "json_schema") else with_schema_in_prompt(messages, json_schema)
        cap = self.max_tokens_cap
        body: dict = {"model": self.model, "messages": msgs, self.max_tokens_param: min(max_tokens, cap or max_tokens)}
        if self.send_temperature:
            body["temperature"] = temperature
        if self.send_reasoning_effort:
            body["reasoning_effort"] = self.reasoning_effort
        if mode == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": _schema_name(json_schema), "schema": json_schema},
            }
        elif mode == "json_object":
            body["response_format"] = {"type": "json_object"}
        if self.extra_body:
            body["extra_body"] = self.extra_body
        t0 = time.monotonic()
        try:
            resp = self._client.chat.completions.create(**body, timeout=min(self.timeout_s, left))
        except openai.APITimeoutError:
            raise _Retryable(f"timeout: no answer within {min(self.timeout_s, left):.1f}s") from None
        except openai.APIConnectionError as e:
            raise _Retryable(f"connection error ({_root_cause(e)})") from None
        except openai.APIStatusError as e:
            status = e.status_code
            if status in (401, 403):
                # the body often echoes the key, masked or not: say nothing of it
                access = "" if status == 401 else f", and that the key may use model {self.model!r}"
                raise _Fatal(f"HTTP {status}: authentication failed ({status}); {AUTH_HINT}{access}") from None
            detail = _error_detail(e)
            if status in RETRYABLE_STATUS or status >= 500:
                what = "rate limited" if status == 429 else "server error"
                raise _Retryable(f"HTTP {status} {what}: {detail}", _retry_after(e.response)) from None
            if status in (400, 422) and self._adapt(detail, body, mode):
                # the server told us what it does not accept: retry at once with the adapted request
                return self._attempt(messages, max_tokens, temperature, json_schema, start, budget_s)
            raise _Fatal(f"HTTP {status}: {detail}") from None
        except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as e:
            raise _Retryable(f"malformed response body ({type(e).__name__})") from None
        if not getattr(resp, "choices", None):
            raise _Retryable("malformed response: no choices")
        choice = resp.choices[0]
        text = (choice.message.content if choice.message is not None else None) or ""
        usage = getattr(resp, "usage", None)
        parsed = extract_json(split_reasoning(text)[0]) if json_schema is not None else None
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
            reasoning=reasoning_field(choice.message),
        )

    def _adapt(self, detail: str, sent: dict, mode: str | None) -> bool:
        """Learn from a 400/422 what this server rejects; True when the request changed and is worth
        resending. ``sent`` is the body that was rejected and ``mode`` its schema mode: when another
        thread of a batch already adapted to the same rejection, the answer is True without a change."""
        d = detail.lower()
        asked_format = mode in ("json_schema", "json_object")
        with self._lock:
            if asked_format and any(w in d for w in _SCHEMA_WORDS):
                return self._step_down_schema(mode)
            if "temperature" in d and "temperature" in sent:
                self.send_temperature = False
                return True
            fits = fitting_limit(detail, sent.get(self.max_tokens_param) or 0)
            if fits is not None:
                self.max_tokens_cap = fits
                log.warning("%s allows a reply of at most %d tokens here; asking with that", self.backend, fits)
                return True
            if "max_completion_tokens" in d and "max_tokens" in sent:
                self.max_tokens_param = "max_completion_tokens"
                return True
            if "reasoning_effort" in d and "reasoning_effort" in sent:
                self.send_reasoning_effort = False
                log.warning("%s rejects reasoning_effort=%r; asking without it", self.backend, self.reasoning_effort)
                return True
            if asked_format and any(w in d for w in _UNSUPPORTED_WORDS):
                return self._step_down_schema(mode)
        return False

    def _step_down_schema(self, rejected: str) -> bool:
        """json_schema -> json_object -> prompt, once per rejected mode (called under the lock)."""
        if self.schema_mode == rejected:
            self.schema_mode = SCHEMA_MODES[SCHEMA_MODES.index(rejected) + 1]
            self.stats.schema_fallbacks += 1
            log.info("%s rejects response_format %s; now using %s", self.backend, rejected,
                     "json_object with the schema in the prompt" if self.schema_mode == "json_object"
                     else "the schema in the prompt")
        return True

    # -- tenacity hooks ---------------------------------------------------------------------------

    def _wait(self, state: RetryCallState, budget_s: float) -> float:
        n = state.attempt_number
        backoff = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (n - 1))
        backoff *= 0.5 + 0.5 * _jitter()
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            backoff = exc.retry_after
        left = budget_s - state.seconds_since_start
        return max(0.0, min(backoff, left))

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        cause = self._redact(getattr(exc, "cause", str(exc)))
        sleep = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s: attempt %d failed (%s); retrying in %.1fs", self.backend, state.attempt_number, cause, sleep)

    def _redact(self, text: str) -> str:
        """``text`` without the key, any run of 8+ of its characters, or anything shaped like a key."""
        return redact(text, ([self._secret] if self._secret else []) + self._query_secrets)


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
