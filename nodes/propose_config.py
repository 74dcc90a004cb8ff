"""Ask the engineer for the next stage's configuration and extract it from the reply.

LLM engineers (`settings.engineer` in self | base | openai | gemini | a custom endpoint name) get the run's
family's system prompt and answer schema (`families/base.py` `LoopFamily`; for MAPF-FrozenLake
`prompts/engineer_system.md` with `EnvConfig.engineer_schema()` in its `{schema}` placeholder, for a level-share
family one generated from its levels) and, as the user message, the context from `summarize_failures` plus, on a
retry, the validation errors of the previous attempt. Structured output (`json_schema`) is asked for unless
`settings.engineer_structured` is False; backends that cannot enforce it put the schema in the prompt.

Classic engineers (fixed | random | learnability | threshold | rlve: the family's `classic`, e.g.
`families/mapf_curricula.py` over MAPF's per-size knobs, `families/level_share.py` over level shares) answer
through the same node with the same answer shape, and their answers go through the same validation.

Files (stage_<k>/): `engineer_prompt.md` (the request parameters, max_tokens, temperature and whether a
json_schema was sent, then the exact messages) and `engineer_reply.md` (the reply as received, made inert
first, `nodes.inert.inert_reply`: API keys and key-shaped tokens redacted, control characters removed,
`<`/`>` escaped; the reply is untrusted, and a remote engineer may echo a key);
attempt 1 writes them, later attempts append a section each (written atomically, `trainer.files`).

The reply is read by the family (`LoopFamily.read_reply`: the bounded JSON scan of `families/reply.py`, for the
family's `Shape`). A reply is cut to its first `MAX_REPLY_CHARS` (200,000) characters before anything reads it,
key masking included (a config with its rationale takes about 2,000; the cut is noted in engineer_reply.md's
header and in the log line, and the saved reply is the cut one). When nothing usable is found the proposal is
None and the reason is returned in `feedback`, which `validate_config` sends back to the engineer.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from families import family_of
from families.metrics import upgrade_metrics
from families.reply import MAX_REPLY_CHARS, Extracted
from llm_backends.engineers import CLASSIC_ENGINEERS, reply_tokens
from llm_backends.replies import Heard, ask
from nodes.inert import inert_reply, inert_value
from trainer.files import append_text_atomic, stage_dir, write_text_atomic

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from graph.settings import RunContext, Settings
    from graph.state import LoopState
    from llm_backends.base import ChatModel

# ----------------------------------------------------------------------------- extraction (pure)


def user_message(context: str, feedback: list[str]) -> str:
    msg = context.strip()
    if feedback:
        errs = "\n".join(f"- {f}" for f in feedback)
        msg += (
            "\n\n## Your previous reply could not be used\n"
            f"{errs}\n\nReply again with ONE JSON object that follows the answer contract, and nothing else."
        )
    return msg


def _request_line(kwargs: dict) -> str:
    """The request parameters as one line of engineer_prompt.md (the schema itself is in the system prompt)."""
    schema = "yes (the answer schema: the config schema plus `rationale`)" if kwargs.get("json_schema") else "no"
    return (
        f"Request: max_tokens={kwargs.get('max_tokens')}, temperature={kwargs.get('temperature')}, "
        f"json_schema={schema}"
    )


def _messages_md(messages: list[dict], header: str, kwargs: dict | None = None) -> str:
    parts = [f"# {header}"]
    if kwargs is not None:
        parts.append(_request_line(kwargs))
    for m in messages:
        parts.append(f"## {m['role']}\n\n{m['content']}")
    return "\n\n".join(parts) + "\n"


def _write(path: Path, text: str, append: bool) -> None:
    if append:
        append_text_atomic(path, "\n\n" + text)
    else:
        write_text_atomic(path, text)


# ----------------------------------------------------------------------------- the node


def propose_config(
    state: LoopState, runtime: Runtime[RunContext], model: ChatModel | None = None
) -> dict[str, Any]:
    """Node: the engineer proposes the next stage's config. `model` answers instead of `open_engineer`'s
    (tests, graph.run's dry run).

    Reads state: stage, config, metrics, context, checkpoint, decision/attempts/feedback (a retry is
    `decision == "retry"`), engineer_memory. Returns: proposal, rationale, attempts, feedback (the
    extraction error when proposal is None, else []), engineer_memory (classic engineers), log.
    """
    settings, run_dir = runtime.context.settings, runtime.context.run_dir
    stage = int(state.get("stage") or 0)
    out_dir = stage_dir(run_dir, stage)
    retry = state.get("decision") == "retry"
    attempt = int(state.get("attempts") or 0) + 1 if retry else 1
    feedback = list(state.get("feedback") or []) if retry else []
    engineer = settings.engineer
    append = attempt > 1
    header = f"attempt {attempt} (stage {stage}, engineer {engineer})"
    family = family_of(settings)

    if engineer in CLASSIC_ENGINEERS:
        rng = random.Random(f"{settings.seed}:{stage}:{attempt}")
        memory = dict(state.get("engineer_memory") or {})
        by_level = upgrade_metrics(state.get("metrics") or {}).get("by_level") or {}
        raw, rationale, memory = family.classic(engineer, state.get("config") or {}, by_level, memory, rng)
        inputs = {
            "config": state.get("config"),
            "metrics_by_level": by_level,
            "memory": state.get("engineer_memory") or {},
        }
        _write(
            out_dir / "engineer_prompt.md",
            f"# {header}\n\nClassic engineer; its inputs:\n\n```json\n"
            + json.dumps(inputs, indent=1, default=str)
            + "\n```\n",
            append,
        )
        _write(
            out_dir / "engineer_reply.md",
            f"# {header}\n\n{rationale}\n\n```json\n{json.dumps(raw, indent=1)}\n```\n",
            append,
        )
        return {
            "proposal": raw,
            "rationale": rationale,
            "attempts": attempt,
            "feedback": [],
            "engineer_memory": memory,
            "reply": None,
            "log": [f"stage {stage}: {engineer} engineer proposed (attempt {attempt})"],
        }

    system, schema = family.system_prompt(settings), family.answer_schema()
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": user_message(state.get("context") or "", feedback)},
    ]
    # a reasoning model's reply limit (llm_backends.engineers.reply_tokens); once a reply needed the larger one,
    # the run's later calls start there (engineer_memory), never asking the same short limit again
    limit, larger = reply_tokens(engineer, settings.engineer_max_tokens, settings.engineer_api_max_tokens)
    memory = dict(state.get("engineer_memory") or {})
    if isinstance(memory.get("reply_tokens"), int) and limit < memory["reply_tokens"] <= larger:
        limit = memory["reply_tokens"]
    kwargs = {
        "max_tokens": limit,
        "temperature": settings.engineer_temperature,
        "json_schema": schema if settings.engineer_structured else None,
    }
    _write(out_dir / "engineer_prompt.md", _messages_md(messages, header, kwargs), append)
    t0 = time.monotonic()
    heard, meta = _ask(model, messages, kwargs, larger, state, settings, run_dir)
    # reasoning is out of `text` (llm_backends.replies): only the answer is read, the reasoning is kept for a person
    text, parsed = (heard.answer, heard.parsed) if heard is not None else ("", None)
    # bounded work and files: a reply is cut to MAX_REPLY_CHARS before anything else reads it
    cut = len(text) - MAX_REPLY_CHARS
    if cut > 0:
        text = text[:MAX_REPLY_CHARS]
        meta["cut_chars"] = cut
    # the reply is untrusted: a key it echoes (or any key-shaped token), control sequences and HTML never
    # reach engineer_reply.md, validation.json, the graph state or a terminal; everything below reads this
    # (and `parsed`, made inert with the proposal)
    text = inert_reply(text)
    if meta.get("error"):
        meta["error"] = inert_reply(str(meta["error"]))
    meta["wall_s"] = round(time.monotonic() - t0, 3)
    _write(out_dir / "engineer_reply.md", reply_md(header, meta, heard, text), append)
    note = (inert_reply(heard.note() or "") or None) if heard is not None else None

    if meta.get("error") is not None:
        ex = Extracted(None, error=f"the engineer call failed: {meta['error']}")
    elif heard.status == "empty":
        ex = Extracted(None, error=f"no answer: the reply was {note}"
                       + ("; think for less of the limit and answer with the JSON object"
                          if heard.last.finish_reason == "length" else ""))
    else:
        ex = family.read_reply(text, heard.last.finish_reason, parsed)
        if ex.config is None and note:
            ex.error = f"the reply was {note}; {ex.error}"
    if heard is not None and len(heard.limits) > 1:
        memory["reply_tokens"] = heard.limits[-1]
    if cut > 0:
        what = f"the reply was cut to its first {MAX_REPLY_CHARS} characters ({cut} more not read)"
        ex.notes.insert(0, what)
        if ex.error:
            ex.error += f"; only the first {MAX_REPLY_CHARS} of its {MAX_REPLY_CHARS + cut} characters were read"
    # decoded JSON strings can hold what the text pass could not see (\u001b, a key in \u escapes)
    proposal, rationale = inert_value(ex.config), inert_reply(ex.rationale)
    return {
        "proposal": proposal,
        "rationale": rationale,
        "attempts": attempt,
        "feedback": [] if ex.config is not None else [ex.error or "no usable proposal"],
        "reply": note,
        "engineer_memory": memory,
        "log": [
            f"stage {stage}: engineer {engineer} replied {len(text)} chars (attempt {attempt}); "
            + (f"the reply was {note}; " if note and ex.config is not None else "")
            + ("found a config" if ex.config is not None else f"no config: {ex.error}")
            + (f" ({'; '.join(ex.notes)})" if ex.notes else "")
        ],
    }


def reply_md(header: str, meta: dict, heard: Heard | None, text: str) -> str:
    """engineer_reply.md's section for one attempt: each call as received (reasoning blocks included, made inert,
    cut to MAX_REPLY_CHARS), the reasoning a backend returned beside it, and the answer that was read when
    reasoning was taken out of it."""
    if heard is None:
        return f"# {header}\n\n<!-- {json.dumps(meta)} -->\n\n\n"
    parts = []
    for i, (res, limit) in enumerate(zip(heard.calls, heard.limits, strict=True)):
        head = header if i == 0 else f"{header}, asked again with max_tokens={limit}"
        call = {"max_tokens": limit, "status": heard.statuses[i], "finish_reason": res.finish_reason,
                "completion_tokens": res.completion_tokens, "latency_s": round(res.latency_s, 3)}
        body = inert_reply((res.text or "")[:MAX_REPLY_CHARS])
        if res.reasoning:
            body += ("\n\n## reasoning the backend returned beside the reply (not read)\n\n"
                     + inert_reply(res.reasoning[:MAX_REPLY_CHARS]))
        parts.append(f"# {head}\n\n<!-- {json.dumps({**meta, **call} if i == len(heard.calls) - 1 else call)} -->"
                     f"\n\n{body}\n")
    if heard.reasoning and text:
        parts.append(f"## the answer read, reasoning taken out\n\n{text}\n")
    return "\n".join(parts)


def _ask(
    model: ChatModel | None, messages: list[dict], kwargs: dict, larger: int, state: LoopState, settings: Settings,
    run_dir: Path,
) -> tuple[Heard | None, dict]:
    """Send the messages, heard (`llm_backends.replies.ask`: reasoning out, an empty or cut reply asked again once
    with `larger` tokens); returns (what was heard, meta). A failed call is (None, meta with the error), never a
    crash."""
    from llm_backends.base import ChatError

    def call(m: ChatModel) -> tuple[Heard | None, dict]:
        try:
            heard = ask(m, messages, larger=larger, **kwargs)
        except ChatError as e:
            return None, {"error": str(e)}
        res = heard.last
        return heard, {
            "model": res.model,
            "latency_s": round(sum(c.latency_s for c in heard.calls), 3),
            "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens,
            "finish_reason": res.finish_reason,
            "error": None,
        }

    if model is not None:
        return call(model)
    from llm_backends.engineers import open_engineer

    with open_engineer(
        settings.engineer,
        checkpoint=state.get("checkpoint"),
        base_model=settings.policy_model,
        run_dir=Path(run_dir),
        model=settings.engineer_model,
        base_url=settings.engineer_base_url,
        keep_server=settings.keep_server,
        dtype=settings.policy_dtype,
        reasoning_effort=settings.engineer_reasoning_effort,
    ) as m:
        return call(m)
