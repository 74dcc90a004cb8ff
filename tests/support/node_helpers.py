"""Shared helpers of the tests/test_nodes_*.py files (no tests here): settings, a scripted chat model, a
scripted policy that answers from the solver's plans, and the engineer loop driven without LangGraph."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from graph.settings import Settings
from llm_backends.base import ChatResult


def make_settings(**over) -> Settings:
    """Small, fast settings for node tests (feasibility dry-runs and data sets stay tiny)."""
    train = {"instances_per_stage": 12, **over.pop("train", {})}
    base = {
        "engineer": "learnability",
        "stages": 3,
        "seed": 7,
        "eval_split": "val-mini",
        "final_split": "test-mini",
        "eval_limit": 12,
        "final_limit": 18,
        "eval_batch_size": 4,
        "engineer_max_attempts": 3,
        "train": train,
    }
    return Settings.model_validate({**base, **over})


def runtime(settings: Settings, run_dir: Path) -> SimpleNamespace:
    return SimpleNamespace(context=SimpleNamespace(settings=settings, run_dir=Path(run_dir)))


class ScriptedChat:
    """A ChatModel whose replies come from a list (one per call, the last repeated) or a function of the
    messages. Records every call's messages and keyword arguments, and the size of every `chat_batch`."""

    def __init__(self, replies, model: str = "scripted"):
        self.replies = replies
        self.model = model
        self.calls: list[tuple[list[dict], dict]] = []
        self.batches: list[int] = []

    def _reply(self, messages) -> str:
        if callable(self.replies):
            return self.replies(messages)
        i = min(len(self.calls) - 1, len(self.replies) - 1)
        return self.replies[i]

    def chat(self, messages, *, max_tokens=512, temperature=0.0, json_schema=None) -> ChatResult:
        self.calls.append(
            (messages, {"max_tokens": max_tokens, "temperature": temperature, "json_schema": json_schema})
        )
        t0 = time.monotonic()
        text = self._reply(messages)
        return ChatResult(text, time.monotonic() - t0, None, len(text.split()), self.model, finish_reason="stop")

    def chat_batch(self, batch, **kw) -> list[ChatResult]:
        self.batches.append(len(batch))
        return [self.chat(m, **kw) for m in batch]

    def close(self) -> None:
        pass


def format_plan(plan) -> str:
    """A plan in the policy's answer format (see env.render_prompt)."""
    lines = [f"Agent {i}: " + " ".join(f"({r},{c})" for r, c in path) for i, path in enumerate(plan)]
    return "<answer>\n" + "\n".join(lines) + "\n</answer>"


def scripted_policy(instances, answer) -> ScriptedChat:
    """A policy that answers instance i's prompt with `answer(i, instance)`."""
    from env import render_prompt

    by_prompt = {render_prompt(inst, style): (i, inst) for i, inst in enumerate(instances) for style in ("full", "compact")}

    def reply(messages):
        i, inst = by_prompt[messages[-1]["content"]]
        return answer(i, inst)

    return ScriptedChat(reply, model="scripted-policy")


def engineer_round(state: dict, settings: Settings, run_dir: Path, model=None, max_rounds: int = 10) -> dict:
    """propose -> validate (-> propose ...) until the route says apply, as the graph does; returns the
    state after the last validation."""
    from graph.graph import route_after_validation
    from nodes.propose_config import propose_config
    from nodes.validate_config import validate_config

    state = dict(state)
    for _ in range(max_rounds):
        state.update(propose_config(state, runtime(settings, run_dir), model=model))
        state.update(validate_config(state, runtime(settings, run_dir)))
        if route_after_validation(state) == "apply":
            return state
    raise AssertionError("the engineer loop did not end")
