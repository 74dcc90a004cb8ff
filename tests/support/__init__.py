"""Helpers the tests share (no tests here). Import them as ``from tests.support.<module> import ...``: the
repository root is on ``sys.path`` (pytest's ``pythonpath`` setting in pyproject.toml), so no test edits it.

- ``fakeopenai``: a local OpenAI-protocol server with scripted replies and faults (the ``fake_openai`` fixture).
- ``smoke_grid``: the smoke comparison grid the slow end-to-end tests share (the ``smoke_grid`` fixture).
- ``node_helpers``: small settings, a scripted chat model and policy, the engineer loop without LangGraph.
- ``stage_child_targets``: functions ``trainer.child`` runs in a child process
  (``target="tests.support.stage_child_targets:<name>"``).
- ``graph_stubs``: the slow nodes stubbed for fast in-process graph.run tests (the ``stub_nodes`` and ``stubs``
  fixtures), `settings_for()`, `run_cli()` (graph.run in a subprocess), `sizes()`.
- ``golden``: the golden smoke runs and their pinned files in tests/golden/ (`python -m tests.support.golden --record`).
- ``run_folder``: `snapshot()` (a folder that must stay untouched, compared before and after) and
  `train_stage_runs()` (which stages a run trained, read from graph.sqlite), `files()` (bytes only).
"""
