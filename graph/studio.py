"""Runs started by LangGraph's own tooling (`langgraph dev` / Studio, the LangGraph SDK or HTTP API).

They pass the runtime context as a plain JSON dict, e.g. `{"preset": "smoke", "engineer": "fixed"}`.
`context_from` turns it into the `RunContext` every node expects, through the same validation as
`python -m graph.run`: `build_settings` (the dict plays the flags: dict over environment variables, e.g.
from `.env`, over the preset) and `graph.preflight.check_before_work` (policy model, splits, engineer keys). A
bad value fails the run with the same one line. Keys: any setting name (`seed`, `stages`, ...), training
ones as `train.<name>` or a nested `"train": {...}`, and `run_dir` (default `runs/studio-<thread id>`).
API keys are never accepted here (environment only).

The run folder gets settings.json (with provenance) the first time, like a CLI run; the settings are
built once per (thread, dict) and reused by every node of the run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from graph.settings import RunContext, SettingsError

RUNS_ROOT = Path("runs")


def _studio_schema():
    """A TypedDict of every setting a caller may pass (the LangGraph server keeps only the keys of the
    context schema): the Settings fields but the run's own bookkeeping, `train` as a nested dict."""
    from typing import Any as _Any

    from typing_extensions import TypedDict  # pydantic's JSON schema needs it on Python < 3.12

    from graph.settings import BOOKKEEPING, Settings

    fields = {name: _Any for name in Settings.model_fields if name not in BOOKKEEPING}
    fields["train"] = dict[str, _Any]
    return TypedDict("StudioContext", fields, total=False)


StudioContext = _studio_schema()
_CACHE: dict[tuple[str, str], RunContext] = {}
_LOCK = threading.Lock()


def _flatten(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k == "train" and isinstance(v, dict):
            out.update({f"train.{sub}": x for sub, x in v.items()})
        else:
            out[str(k)] = v
    return out


def _thread(runtime) -> str:
    info = getattr(runtime, "execution_info", None) if runtime is not None else None
    for attr in ("thread_id", "run_id"):
        v = getattr(info, attr, None) if info is not None else None
        if v:
            return str(v)
    return "local"


def build_context(values: dict[str, Any], thread: str = "local") -> RunContext:
    """A validated RunContext from a plain dict of settings; `SettingsError` (one line) when a value is bad."""
    import os

    from graph.preflight import check_before_work
    from graph.settings import Settings, build_settings
    from trainer.provenance import collect

    cli = _flatten(dict(values))
    secret = sorted(k for k in cli if "key" in k.lower() or "token" in k.lower() or "secret" in k.lower())
    if secret:
        raise SettingsError(f"bad setting {secret[0]}: API keys are read from the environment only "
                            "(ENGINEER_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY), never from the run's settings")
    run_dir = Path(cli.pop("run_dir", None) or RUNS_ROOT / f"studio-{thread}")
    if (run_dir / "settings.json").is_file():  # the same run again (a resumed thread): its own settings
        settings = Settings.load(run_dir / "settings.json")
        return RunContext(settings=settings, run_dir=run_dir)
    settings = build_settings(cli, os.environ, given_as="context")
    check_before_work(settings)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = settings.model_copy(update={"run_dir": run_dir, "run_id": run_dir.name, "provenance": collect()})
    settings.save(run_dir / "settings.json")
    return RunContext(settings=settings, run_dir=run_dir)


def context_from(ctx: Any, runtime=None) -> RunContext:
    """`ctx` itself when it is a RunContext (graph.run), else the RunContext its dict describes."""
    if isinstance(ctx, RunContext):
        return ctx
    if ctx is None:
        ctx = {}
    if not isinstance(ctx, dict):
        raise SettingsError(f"the run's context is a {type(ctx).__name__}; expected a RunContext or a dict of "
                            "settings such as {\"preset\": \"smoke\", \"engineer\": \"fixed\"}")
    key = (_thread(runtime), json.dumps(ctx, sort_keys=True, default=str))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = build_context(ctx, key[0])
        return _CACHE[key]
