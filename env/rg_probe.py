"""The check of a reasoning-gym cell before it becomes a level of a task (`env.rg`): reasoning-gym builds it, its
generator gives `PROBE_QUESTIONS` questions within `QUESTION_CPU_S` of CPU each, reasoning-gym's own scorer accepts
their answers and refuses a junk one. Each cell is checked in a forked child that is stopped at `PROBE_TIMEOUT_S`.
"""

from __future__ import annotations

import time

from .rg_data import OverBudget, cpu_budget, default_signals, draw, mix
from .rg_levels import Level, make_dataset, one_line

QUESTION_CPU_S = 0.5  # the most CPU seconds a level's generator may take for a question. A level's fixed splits
# alone are 72 questions and every stage draws more: at 0.5 s, 36 s of one core per level, so that a task of several
# levels loads in about a minute on 2 cores (futoshiki's 9x9 boards take about 1 s a question, zebra_puzzles' 6
# people with 5 traits 1 s, jugs' 7 jugs over 20 s). CPU time, which other work on the machine barely moves; a cell
# near the limit may still fall on either side on another machine (the outcome is cached per machine).
PROBE_QUESTIONS = 2  # the questions a cell's check draws and times
PROBE_TIMEOUT_S = 8.0 * PROBE_QUESTIONS * QUESTION_CPU_S  # the hard stop, wall seconds, of a check whose generator
# holds on past its CPU budget (in C code, where the budget's signal waits for it)
PROBE_SEED = 5_000_011  # the questions that check a cell before it becomes a level
PROBE_RULE = {"probe_questions": PROBE_QUESTIONS, "question_cpu_s": QUESTION_CPU_S}  # in the cached outcome's key
JUNK = "I do not know."  # an answer no scorer should accept


def probe_cell(dataset: str, lv: Level) -> str | None:
    """Why a cell cannot be a level (None: it can): reasoning-gym cannot build it, its generator raises or takes
    over `QUESTION_CPU_S` of CPU a question, its questions have no answer that its own scorer accepts, or its scorer
    accepts a junk answer too."""
    seed = mix(PROBE_SEED, repr(lv.attr_values))
    try:
        ds = make_dataset(dataset, lv.attr_levels, PROBE_QUESTIONS + 1, seed)
    except Exception as e:
        return f"reasoning-gym cannot build it: {one_line(e)}"
    budget = PROBE_QUESTIONS * QUESTION_CPU_S
    t0 = time.process_time()
    try:
        with cpu_budget(budget):
            got = draw(lambda size, s: ds if s == seed else make_dataset(dataset, lv.attr_levels, size, s),
                       dataset, lv.index, PROBE_QUESTIONS, seed, set())
    except OverBudget:
        return (f"its generator took over {budget:g} s of CPU for {PROBE_QUESTIONS} questions; allowed: "
                f"{QUESTION_CPU_S:g} s a question")
    per = (time.process_time() - t0) / max(1, len(got.items))
    if not got.items:
        if not got.errors:
            return "reasoning-gym gives no answer to check"
        return got.errors[0] if got.errors[0].startswith("its scorer") else f"its generator raises: {got.errors[0]}"
    if per > QUESTION_CPU_S:
        return f"its generator takes {per:.2f} s of CPU a question; allowed: {QUESTION_CPU_S:g} s"
    it = got.items[0]
    try:
        junk = float(ds.score_answer(JUNK, it.entry()))
    except Exception:
        junk = 0.0
    return f"its scorer accepts any answer ({JUNK!r} scores {junk:g})" if junk >= 1.0 else None


def probe_cells(dataset: str, cells: list[Level]):
    """(cell, `probe_cell`'s note) for each cell, each in a forked child stopped at `PROBE_TIMEOUT_S` (a generator
    that searches for longer, past its CPU budget). Without fork (not on Linux, or in a daemon process), in this
    process, within its CPU budget only."""
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods() or mp.current_process().daemon:  # a daemon may not fork
        yield from ((lv, probe_cell(dataset, lv)) for lv in cells)
        return
    pending = list(cells)
    while pending:
        # leaving the block terminates the child (SIGTERM): still searching, or idle
        with mp.get_context("fork").Pool(1, initializer=default_signals) as pool:
            while pending:
                lv = pending.pop(0)
                try:
                    why = pool.apply_async(probe_cell, (dataset, lv)).get(PROBE_TIMEOUT_S)
                except mp.TimeoutError:
                    yield lv, f"its generator took over {PROBE_TIMEOUT_S:g} s for {PROBE_QUESTIONS} questions"
                    break
                yield lv, why
