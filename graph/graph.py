"""Wiring of the environment-engineer loop. Only add_node / add_edge and routing live here; each node is
a plain function in nodes/, wrapped by graph/wrappers.py, and fixed settings reach it through the runtime context
(graph.settings)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from langgraph.graph import END, START, StateGraph

from graph.runfolder import in_run_folder
from graph.settings import RunContext
from graph.state import LoopState
from graph.wrappers import cancellable, gpu_freed_first, tracked
from nodes.apply import apply
from nodes.evaluate import evaluate, final_evaluate
from nodes.propose_config import propose_config
from nodes.report import report
from nodes.summarize_failures import summarize_failures
from nodes.train_stage import train_stage
from nodes.validate_config import validate_config

if TYPE_CHECKING:
    from langgraph_sdk.runtime import ServerRuntime


def route_after_evaluate(state: LoopState, runtime) -> Literal["summarize_failures", "final_evaluate"]:
    """After the last stage's evaluation the run ends with the benchmark; otherwise the engineer works."""
    from graph.studio import context_from

    last = context_from(runtime.context, runtime).settings.stages - 1
    return "final_evaluate" if state["stage"] >= last else "summarize_failures"


def route_after_validation(state: LoopState) -> Literal["propose_config", "apply"]:
    """A "retry" goes back to the engineer with the errors; anything else (accepted, projected or kept) is
    applied."""
    return "propose_config" if state.get("decision") == "retry" else "apply"


def build_graph(context_schema=RunContext, server: bool = False) -> StateGraph:
    """The loop's graph; `server=True`: its nodes as coroutines that a cancelled run stops (`cancellable`)."""
    g = StateGraph(LoopState, context_schema=context_schema)
    wrap = cancellable if server else (lambda node: node)
    # Every node sees state paths resolved in the run folder and returns them relative to it.
    g.add_node("apply", wrap(tracked("apply", in_run_folder(apply))))
    g.add_node("train_stage", wrap(tracked("train_stage", in_run_folder(gpu_freed_first(train_stage)))))
    g.add_node("evaluate", wrap(tracked("evaluate", in_run_folder(evaluate))))
    g.add_node("summarize_failures", wrap(tracked("summarize_failures", in_run_folder(summarize_failures))))
    g.add_node("propose_config", wrap(tracked("propose_config", in_run_folder(propose_config))))
    g.add_node("validate_config", wrap(tracked("validate_config", in_run_folder(validate_config))))
    g.add_node("final_evaluate", wrap(tracked("final_evaluate", in_run_folder(final_evaluate))))
    g.add_node("report", wrap(tracked("report", in_run_folder(report))))

    # Stage 0: apply generates the training set of the random stage-0 config.
    g.add_edge(START, "apply")
    # Every stage trains on the set apply just generated, then is evaluated on the fixed validation set.
    g.add_edge("apply", "train_stage")
    g.add_edge("train_stage", "evaluate")
    # Last stage -> final benchmark; otherwise the engineer designs the next stage.
    g.add_conditional_edges("evaluate", route_after_evaluate)
    # Evidence -> proposal -> validation.
    g.add_edge("summarize_failures", "propose_config")
    g.add_edge("propose_config", "validate_config")
    # An unusable proposal goes back to the engineer (bounded); an accepted or kept config is applied.
    g.add_conditional_edges("validate_config", route_after_validation)
    # The run closes with the benchmark and the report.
    g.add_edge("final_evaluate", "report")
    g.add_edge("report", END)
    return g


def make_graph(checkpointer=None, interrupt_before: list[str] | None = None):
    """The compiled graph (graph.run passes a SqliteSaver; `interrupt_before=["apply"]` for --approve)."""
    return build_graph().compile(checkpointer=checkpointer, interrupt_before=interrupt_before or None)


def studio_graph(runtime: ServerRuntime = None):
    """The graph `langgraph.json` names (`./graph/graph.py:studio_graph`), for LangGraph's own tooling:
    compiled without a checkpointer, because the LangGraph server brings its own. Its runtime context is a
    plain dict of settings, e.g. `{"preset": "smoke", "engineer": "fixed"}` (graph.studio: the same Settings
    validation as `python -m graph.run`); its schema lists every setting, typed, so Studio shows them as a form.

    The server calls it once per run with `runtime` (a graph factory): the run's context as sent, before the
    server keeps only the schema's keys, so that an unknown key (a misspelling) is refused in one line rather
    than dropped. Its nodes are coroutines that a cancelled run stops (`cancellable`)."""
    from graph.studio import StudioContext, check_context_keys

    execution = getattr(runtime, "execution_runtime", None) if runtime is not None else None
    if execution is not None and isinstance(getattr(execution, "context", None), dict):
        check_context_keys(execution.context)
    return build_graph(context_schema=StudioContext, server=True).compile()
