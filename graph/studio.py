"""Runs started by LangGraph's own tooling (`langgraph dev` / Studio, the LangGraph SDK or HTTP API).

They pass the runtime context as a plain JSON dict, e.g. `{"preset": "smoke", "engineer": "fixed"}`.
`context_from` turns it into the `RunContext` every node expects, through the same validation as
`python -m graph.run`: `build_settings` (the dict plays the flags: dict over environment variables, e.g.
from `.env`, over the preset) and `graph.preflight.check_before_work` (policy model, splits, engineer keys). A
bad value fails the run with the same one line. Keys: any setting name (`seed`, `stages`, ...), training
ones as `train.<name>` or a nested `"train": {...}`, and `run_dir` (default `runs/studio-<thread id>`).
A key that is no setting is refused in one line naming the closest setting, or every allowed key
(`check_context_keys`; on the server `graph.graph.studio_graph` checks the context as sent, before the server
keeps only the schema's keys). API keys are never accepted here (environment only). A run resumed without a
context (`Command(resume=...)` alone) goes on with its thread's settings.

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


def _typed_dict(name: str, model, skip: tuple[str, ...] = (), nested: dict | None = None):
    """A TypedDict (total=False) of `model`'s fields with their types and descriptions: the schema Studio shows
    as a form (the LangGraph server keeps only the keys of the context schema)."""
    from typing import Annotated

    from pydantic import Field
    from typing_extensions import TypedDict  # pydantic's JSON schema needs it on Python < 3.12

    fields = {}
    for field, info in model.model_fields.items():
        if field in skip:
            continue
        ann = (nested or {}).get(field, info.annotation)
        fields[field] = Annotated[ann, Field(description=info.description)] if info.description else ann
    return TypedDict(name, fields, total=False)


def _studio_schema():
    """The context schema: every setting a caller may pass, typed (the Settings fields but the run's own
    bookkeeping), `train` as a nested dict of the training settings."""
    from graph.settings import BOOKKEEPING, Settings
    from trainer.config import TrainConfig

    train = _typed_dict("TrainContext", TrainConfig)
    return _typed_dict("StudioContext", Settings, skip=BOOKKEEPING, nested={"train": train})


StudioContext = _studio_schema()
_CACHE: dict[tuple[str, str], RunContext] = {}
_BY_THREAD: dict[str, RunContext] = {}  # a thread's run: what a resumed run of it (no context sent) goes on with
_LOCK = threading.Lock()
# keys the LangGraph server itself may put in a run's context (its configurable, mirrored when none was sent)
_SERVER_KEYS = {"thread_id", "graph_id", "assistant_id", "user_id", "checkpoint_id", "checkpoint_ns",
                "checkpoint_map", "cron_id"}


def _server_key(key: str) -> bool:
    return key in _SERVER_KEYS or key.startswith(("__", "langgraph_", "x-"))


def check_context_keys(values: dict[str, Any]) -> None:
    """Refuse a key that is no setting in one line naming the closest setting, or else every allowed key (the
    server would otherwise drop it, and the run would go on with the preset's value). Training settings go
    as `train.<name>` or inside `"train": {...}`."""

    from graph.settings import BOOKKEEPING, Settings
    from trainer.config import TrainConfig

    top = [k for k in Settings.model_fields if k not in BOOKKEEPING]
    train = list(TrainConfig.model_fields)
    for key, value in values.items():
        key = str(key)
        if key in top or key in BOOKKEEPING or _server_key(key) or _secret(key, top):
            if key == "train" and value is not None and not isinstance(value, dict):
                raise SettingsError(f"bad context key 'train': {value!r}: a dict of training settings is expected, "
                                    "e.g. {\"train\": {\"max_steps\": 2}}")
            for sub in (value if key == "train" and isinstance(value, dict) else {}):
                if str(sub) not in train:
                    raise SettingsError(_unknown(f"train.{sub}", str(sub), train, "train."))
            continue
        if key.startswith("train."):
            if key[6:] not in train:
                raise SettingsError(_unknown(key, key[6:], train, "train."))
            continue
        raise SettingsError(_unknown(key, key, top + [f"train.{t}" for t in train], ""))


def _unknown(shown: str, word: str, choices: list[str], prefix: str) -> str:
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    if close:
        return f"unknown context key {shown!r}: did you mean {prefix + close[0]!r}?"
    allowed = [c for c in choices if not c.startswith("train.")]
    where = "training settings" if prefix else "settings"
    more = " and train.<name> for a training setting" if not prefix else ""
    return f"unknown context key {shown!r}; allowed {where}: {', '.join(allowed)}{more}"


def _secret(key: str, settings=()) -> bool:
    """A key that looks like a credential (`openai_api_key`, `token`, ...) and is no setting (`eval_max_tokens` is)."""
    low = key.lower()
    if key in settings or (low.startswith("train.") and not _secret(low[6:])):
        return False
    return any(word in low for word in ("key", "token", "secret", "password"))


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

    values = {k: v for k, v in dict(values).items() if not _server_key(str(k))}
    cli = _flatten(values)
    secret = sorted(k for k in cli if _secret(k, Settings.model_fields))
    if secret:
        raise SettingsError(f"bad setting {secret[0]}: API keys are read from the environment only "
                            "(ENGINEER_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY), never from the run's settings")
    check_context_keys(values)
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
    thread = _thread(runtime)
    key = (thread, json.dumps(ctx, sort_keys=True, default=str))
    with _LOCK:
        if key not in _CACHE:
            if thread != "local" and thread in _BY_THREAD and all(_server_key(str(k)) for k in ctx):
                _CACHE[key] = _BY_THREAD[thread]  # a run resumed without its context: the thread's own run
            else:
                _CACHE[key] = build_context(ctx, thread)
        if thread != "local":
            _BY_THREAD.setdefault(thread, _CACHE[key])
        return _CACHE[key]
