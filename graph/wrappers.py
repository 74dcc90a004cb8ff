"""The wrappers graph/graph.py puts around every node: the run's bookkeeping (`tracked`), the GPU freed before
training (`gpu_freed_first`), and a coroutine a cancelled server run stops (`cancellable`)."""

from __future__ import annotations


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
