"""The graph state: small data only. Heavy artefacts (datasets, checkpoints, answers) live in the run
folder and the state holds their paths, so every checkpoint of the state stays a few kilobytes.

Paths (`PATH_KEYS`) are stored relative to the run folder; the nodes see them resolved against the folder
being run (graph.runfolder.in_run_folder), so a moved or copied run reads its own files."""

from __future__ import annotations

import operator
from typing import Annotated, Any

# pydantic, which builds Studio's schemas, reads typing.TypedDict only from Python 3.12 on
from typing_extensions import TypedDict

PATH_KEYS = ("train_path", "checkpoint")


class LoopState(TypedDict, total=False):
    stage: int
    """Index of the stage being trained / evaluated (0 = the random stage-0 config)."""
    config: dict[str, Any]
    """EnvConfig (model_dump) the current stage's training set was generated from."""
    train_path: str
    """Path of the current stage's train.jsonl (stored relative to the run folder)."""
    checkpoint: str | None
    """Latest policy checkpoint folder, stored relative to the run folder (None before the first train
    stage: the base model)."""
    reward_state: dict[str, Any]
    """The reward's running short-answer share (adaptive weights), carried across stages."""
    train_metrics: dict[str, Any]
    """Metrics of the latest train stage (train/...)."""
    metrics: dict[str, Any]
    """Metrics of the latest evaluation (eval/...)."""
    start_metrics: dict[str, Any] | None
    """Metrics of the cached SFT warm start's own evaluation (eval/..., stage_0/start/), set at stage 0's evaluate."""
    history: list[dict[str, Any]]
    """One entry per finished stage: {stage, config, metrics, rationale, decision}."""
    context: str
    """The context shown to the engineer for the next proposal (also in stage_k/summary.md)."""
    proposal: dict[str, Any] | None
    """The engineer's latest raw proposal (parsed JSON), None when it sent nothing usable."""
    rationale: str
    """The engineer's explanation of its latest proposal."""
    reply: str | None
    """How the engineer's latest reply was heard when not at once (empty, cut at its token limit, asked again with
    a larger one: llm_backends.replies); None when it answered in full."""
    attempts: int
    """Proposals tried for the next stage so far."""
    feedback: list[str]
    """Validation errors sent back to the engineer on a retry."""
    accepted: dict[str, Any] | None
    """The final config of the next stage (EnvConfig dump, num_instances included): what validate_config
    accepted, projected or kept, or a person's edit under --approve after the same checks. Its one check
    was there: apply generates from it as is, without validating it again."""
    decision: str
    """validate_config's decision: accepted | projected | kept_previous | retry."""
    engineer_memory: dict[str, Any]
    """State of the classic engineers (e.g. the fixed config, threshold levels)."""
    final_metrics: dict[str, Any] | None
    """Metrics of the final benchmark evaluation."""
    log: Annotated[list[str], operator.add]
    """One-line summaries of what happened, appended by nodes (shown as progress)."""
