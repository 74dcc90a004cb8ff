"""Wiring of the environment-engineer loop. Only add_node / add_edge and routing live here; each node is
a plain function in nodes/, fixed settings reach it through the runtime context (graph.settings)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from langgraph.graph import END, START, StateGraph

from graph.runfolder import in_run_folder
from graph.settings import RunContext
from graph.state import LoopState
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


def gpu_freed_first(node):
    """`node` after `llm_backends.policy.release_gpu_for_training()`: on a GPU build no kept vLLM server holds GPU memory
    while a stage trains (the node itself, looked up at build time, may be a test's stub)."""

    def wrapped(state, runtime):
        import sys

        if "llm_backends.policy" in sys.modules:  # no server can be kept before llm_backends.policy was ever imported
            sys.modules["llm_backends.policy"].release_gpu_for_training()
        return node(state, runtime)

    wrapped.__name__ = getattr(node, "__name__", "train_stage")
    wrapped.__doc__ = node.__doc__
    return wrapped


def tracked(name: str, node):
    """`node` with the run's bookkeeping around it, whoever runs the graph (graph.run, LangGraph's server):
    - a plain dict as the runtime context (LangGraph Studio / SDK) becomes a validated `RunContext`
      (`graph.studio.context_from`), through the same Settings validation as `python -m graph.run`; with
      `approve` in it, apply first waits for a person's decision in a LangGraph interrupt (graph.approve);
    - before `evaluate` with `keep_checkpoints=last`, older stages' weights are deleted (graph.prune);
    - after it, the loop's TensorBoard / W&B run gets what it produced (graph.tracking)."""

    def wrapped(state, runtime):
        from graph.studio import context_from

        ctx = context_from(runtime.context, runtime)
        from_dict = ctx is not runtime.context  # LangGraph's server (Studio, the SDK), not graph.run
        if from_dict:
            runtime = runtime.override(context=ctx)
        extra: dict = {}
        if (name == "apply" and from_dict and ctx.settings.approve and state.get("accepted")
                and "config" in state):  # `approve` on the LangGraph server: a person decides through an interrupt
            from graph.approve import interrupt_for_approval

            extra = interrupt_for_approval(state, ctx.settings, ctx.run_dir)
            state = {**state, **extra}
        if name == "evaluate" and ctx.settings.keep_checkpoints == "last":
            from graph.prune import prune_older
            from graph.runfolder import resolve_in_run

            ckpt = state.get("checkpoint")
            prune_older(ctx.run_dir, int(state.get("stage") or 0),
                        resolve_in_run(ckpt, ctx.run_dir) if ckpt else None)
        update = node(state, runtime)
        if extra:
            update = {**extra, **(update or {})}
        from graph.tracking import track

        track(name, state, update, ctx.run_dir, ctx.settings)
        return update

    wrapped.__name__ = getattr(node, "__name__", name)
    wrapped.__doc__ = node.__doc__
    return wrapped


def cancellable(node):
    """`node` as a coroutine for LangGraph's server, which cancels a run by cancelling its task: the node runs
    in a worker thread, and a cancellation sets the stop flag (trainer.stop), so a training stage stops after
    the step under way, saved (or inside it, when it outlasts `trainer.child.STOP_GRACE_S`), and an evaluation
    after its batch, keeping what is saved, instead of running on alone. The flag is cleared once the node has
    ended."""
    import asyncio
    import contextvars

    async def wrapped(state, runtime):
        from trainer import stop

        work = asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, node, state,
                                                          runtime)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.done():
                stop.request_stop("the run was cancelled")
                work.add_done_callback(lambda f: (f.cancelled() or f.exception(), stop.reset()))
            raise

    wrapped.__name__ = getattr(node, "__name__", "node")
    wrapped.__doc__ = node.__doc__
    return wrapped


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
