"""LangGraph tooling: the graph langgraph.json names runs with a plain dict of settings
as its context (Studio, the SDK, the HTTP API) through the same Settings validation as graph.run;
`langgraph dev` serves it (tested through the SDK against a real dev server, stopped before training so it
stays fast; the full smoke run through the server is the `slow` test at the end); .env.example lists
every environment variable the code reads, with no values."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import graph.graph as gg
from graph import studio
from graph.settings import ENV_VARS, SettingsError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_cache():
    studio._CACHE.clear()
    studio._BY_THREAD.clear()
    yield
    studio._CACHE.clear()
    studio._BY_THREAD.clear()


def test_studio_graph_runs_with_a_plain_dict_context(tmp_path, monkeypatch, stub_nodes):  # noqa: F811
    """The compiled studio graph, invoked as LangGraph's tooling does: a dict context, smoke preset."""
    monkeypatch.delenv("PRESET", raising=False)
    run_dir = tmp_path / "studio-run"
    ctx = {"preset": "smoke", "engineer": "fixed", "stages": "2", "seed": 4, "run_dir": str(run_dir),
           "train": {"instances_per_stage": 8}}
    final = asyncio.run(gg.studio_graph().ainvoke({}, context=ctx))  # the server's nodes are coroutines
    assert final["stage"] == 1 and final["final_metrics"]
    saved = json.loads((run_dir / "settings.json").read_text())
    assert saved["preset"] == "smoke" and saved["seed"] == 4 and saved["train"]["instances_per_stage"] == 8
    assert saved["run_id"] == "studio-run" and saved["provenance"]["git"]["commit"]
    assert len((run_dir / "stage_1" / "train.jsonl").read_text().splitlines()) == 8


def test_studio_context_schema_lists_the_settings():
    schema = gg.studio_graph().get_context_jsonschema()
    props = set(schema["properties"])
    assert {"preset", "engineer", "seed", "stages", "run_dir", "train"} <= props
    assert not {"run_id", "provenance"} & props  # the run's own bookkeeping is not for callers


def test_studio_schemas_are_typed():
    """Studio reads the input, output and context schemas as JSON schema (pydantic): every one builds, without
    a warning, and the context's settings carry their types."""
    import warnings

    g = gg.studio_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schemas = {"input": g.get_input_jsonschema(), "output": g.get_output_jsonschema(),
                   "context": g.get_context_jsonschema()}
    assert schemas["input"]["properties"]["stage"]["type"] == "integer"
    assert schemas["output"]["properties"]["final_metrics"]["anyOf"][0]["type"] == "object"
    props = schemas["context"]["properties"]
    assert props["preset"]["enum"] == ["smoke", "cpu", "cpu-long", "rg-cpu", "paper"]
    assert props["seed"]["type"] == "integer" and props["approve"]["type"] == "boolean"
    assert props["stages"]["description"].startswith("number of training stages")
    train = schemas["context"]["$defs"][props["train"]["$ref"].split("/")[-1]]["properties"]
    assert train["learning_rate"]["type"] == "number" and train["max_steps"]["type"] == "integer"


@pytest.mark.parametrize("ctx, match", [
    ({"preset": "smoke", "seeed": 1}, r"^unknown context key 'seeed': did you mean 'seed'\?$"),
    ({"preset": "smoke", "train": {"max_stepz": 1}}, r"^unknown context key 'train.max_stepz': did you mean "
                                                     r"'train.max_steps'\?$"),
    ({"preset": "smoke", "wibble": 1}, r"^unknown context key 'wibble'; allowed settings: preset, task, start_config, engineer, .*seed,"),
    ({"preset": "smoke", "train": 3}, r"^bad context key 'train': 3: a dict of training settings is expected"),

    ({"preset": "smoke", "seed": "-1"}, r"bad setting seed from the run's context key 'seed': '-1'"),
    ({"preset": "nope"}, r"PRESET='nope' is not a preset; allowed: smoke, cpu, cpu-long, rg-cpu, paper"),
    ({"preset": "smoke", "train": {"report_to": "mlflow"}}, r"train.report_to .*'mlflow'"),
    ({"preset": "smoke", "openai_api_key": "sk-x"}, r"API keys are read from the environment only"),
    ({"preset": "smoke", "run_id": "x"}, r"run_id is set by the run itself"),
])
def test_bad_context_values_are_one_line(tmp_path, ctx, match):
    with pytest.raises(SettingsError, match=match):
        studio.build_context({**ctx, "run_dir": str(tmp_path / "r")})
    assert not (tmp_path / "r").exists()  # nothing is created for a refused run


def test_settings_named_like_credentials_are_settings(tmp_path):
    """`eval_max_tokens` and `engineer_max_tokens` are settings, not API keys (an `*_api_key` still is refused)."""
    rc = studio.build_context({"preset": "smoke", "engineer": "fixed", "eval_max_tokens": 16,
                               "engineer_max_tokens": 300, "run_dir": str(tmp_path / "r")})
    assert rc.settings.eval_max_tokens == 16 and rc.settings.engineer_max_tokens == 300


def test_context_is_built_once_per_thread_and_dict(tmp_path):
    class Info:
        thread_id = "t-1"

    class RT:
        execution_info = Info()

    ctx = {"preset": "smoke", "engineer": "fixed", "run_dir": str(tmp_path / "r")}
    a = studio.context_from(ctx, RT())
    assert studio.context_from(dict(ctx), RT()) is a  # every node of a run sees the very same settings
    assert studio.context_from(a) is a


def test_default_run_dir_is_named_after_the_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(studio, "RUNS_ROOT", tmp_path / "runs")
    rc = studio.build_context({"preset": "smoke", "engineer": "fixed"}, "abc-123")
    assert rc.run_dir == tmp_path / "runs" / "studio-abc-123" and rc.settings.run_id == "studio-abc-123"


# ----------------------------------------------------------------------------- .env.example, langgraph.json


def _code_env_names() -> set[str]:
    names = set(ENV_VARS)
    pat = re.compile(r"""(?:environ\.get|getenv|environ\[|env\.get|get)\(\s*["']([A-Z][A-Z0-9_]+)["']""")
    for pkg in ("env", "llm_backends", "nodes", "graph", "evals"):
        for f in (ROOT / pkg).rglob("*.py"):
            names |= set(pat.findall(f.read_text()))
    return names


def test_env_example_lists_every_variable_without_values():
    text = (ROOT / ".env.example").read_text()
    assigned = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            assigned[m.group(1)] = m.group(2).split("#", 1)[0].strip()
    mentioned = set(re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", text))
    missing = sorted(n for n in _code_env_names() if n not in mentioned)
    assert not missing, f".env.example lacks {missing}"
    assert {"ENGINEER_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "KEEP_CHECKPOINTS"} <= set(assigned)
    assert all(v == "" for v in assigned.values()), {k: v for k, v in assigned.items() if v}
    assert "TRAIN__" in text


def test_langgraph_json_and_dev_extra():
    spec = json.loads((ROOT / "langgraph.json").read_text())
    assert spec["graphs"] == {"env_engineer": "./graph/graph.py:studio_graph"}
    assert spec["env"] == ".env"  # optional: copied from .env.example; a missing .env loads nothing
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("langgraph-cli[inmem]") for d in extras["dev"])
    assert any(d.startswith("wandb") for d in extras["wandb"])
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.startswith("wandb") for d in deps)  # never required


# ----------------------------------------------------------------------------- a real `langgraph dev`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dev_server(tmp_path):
    exe = shutil.which("langgraph", path=str(Path(sys.executable).parent)) or shutil.which("langgraph")
    if exe is None:
        pytest.skip("langgraph-cli is not installed (pip install -e '.[dev]')")
    pytest.importorskip("langgraph_sdk")
    port = _free_port()
    state_dir = ROOT / ".langgraph_api"  # the in-memory server's persistence, in its working folder
    existed = state_dir.exists()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(LANGGRAPH_CLI_NO_ANALYTICS="1", PYTHONPATH=str(ROOT))
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([exe, "dev", "--no-browser", "--no-reload", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"langgraph dev did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        if not existed:
            shutil.rmtree(state_dir, ignore_errors=True)


def _sdk_run(url: str, context: dict, **kw):
    from langgraph_sdk import get_client

    async def go():
        client = get_client(url=url)
        thread = await client.threads.create()
        out = await client.runs.wait(thread["thread_id"], "env_engineer", input={}, context=context,
                                     raise_error=False, **kw)
        state = await client.threads.get_state(thread["thread_id"])
        return out, state

    return asyncio.run(go())


def test_langgraph_dev_serves_the_graph_through_the_sdk(tmp_path, dev_server):
    """A smoke-preset run started through the SDK with a dict context validates its settings and applies
    stage 0 (stopped before training: fast); a bad value fails the run with the one-line SettingsError."""
    run_dir = tmp_path / "run"
    out, state = _sdk_run(dev_server, {"preset": "smoke", "engineer": "fixed", "run_dir": str(run_dir)},
                          interrupt_before=["train_stage"])
    assert state["next"] == ["train_stage"] and state["values"]["stage"] == 0, out
    assert json.loads((run_dir / "settings.json").read_text())["preset"] == "smoke"
    assert (run_dir / "stage_0" / "train.jsonl").is_file()
    out, _ = _sdk_run(dev_server, {"preset": "smoke", "seed": "-1", "run_dir": str(tmp_path / "bad")})
    assert out["__error__"]["error"] == "SettingsError"
    assert "bad setting seed from the run's context key 'seed': '-1'" in out["__error__"]["message"]
    assert not (tmp_path / "bad").exists()
    # a misspelt key is refused, not dropped by the server (the run would go on with the preset's value)
    out, _ = _sdk_run(dev_server, {"preset": "smoke", "seeed": 3, "run_dir": str(tmp_path / "typo")})
    assert out["__error__"]["error"] == "SettingsError", out
    assert out["__error__"]["message"] == "unknown context key 'seeed': did you mean 'seed'?"
    assert not (tmp_path / "typo").exists()


def _server_graph():
    """The studio graph as the LangGraph server runs it (async nodes), with an in-memory checkpointer."""
    from langgraph.checkpoint.memory import InMemorySaver

    return gg.build_graph(context_schema=studio.StudioContext, server=True).compile(checkpointer=InMemorySaver())


def test_approve_in_the_context_pauses_in_an_interrupt_whose_resume_value_decides(tmp_path, stubs):  # noqa: F811
    """`approve` on the server path: before stage 1's apply the run pauses in an interrupt showing the
    proposal; an unusable answer pauses again with the reason; an edited config is checked, applied and recorded in
    validation.json as `--approve` records it."""
    from langgraph.types import Command

    from tests.support.graph_stubs import sizes

    run_dir = tmp_path / "run"
    ctx = {"preset": "smoke", "engineer": "fixed", "stages": 2, "approve": True, "run_dir": str(run_dir),
           "feasibility_n": 4, "train": {"instances_per_stage": 8}}
    g, cfg = _server_graph(), {"configurable": {"thread_id": "t-approve"}}

    async def go(value):
        return await g.ainvoke(value, cfg, context=ctx)

    out = asyncio.run(go({}))
    (pause,) = out["__interrupt__"]
    assert pause.value["stage"] == 1 and "resume with \"y\"" in pause.value["question"]
    assert pause.value["proposed"]["sizes"] and "size" in pause.value["table"]
    assert not (run_dir / "stage_1").exists()  # nothing applied before the answer
    out = asyncio.run(go(Command(resume="maybe")))
    assert out["__interrupt__"][0].value["error"] == "please answer y, n or an edited config (got 'maybe')"
    edited = {"sizes": sizes({3: 1.0}, hole=0.05, wait=0.0)}
    out = asyncio.run(go(Command(resume=edited)))
    assert "__interrupt__" not in out and out["final_metrics"] and out["decision"] == "edited (person)"
    applied = json.loads((run_dir / "stage_1" / "config.json").read_text())
    assert applied["sizes"]["3"]["data_ratio"] == 1.0 and applied["sizes"]["4"]["data_ratio"] == 0.0
    validation = json.loads((run_dir / "stage_0" / "validation.json").read_text())
    assert validation["final"] == "edited (person)"
    person = [r for r in validation["decisions"] if r.get("by") == "person"]
    assert len(person) == 1 and person[0]["accepted"]["sizes"]["3"]["data_ratio"] == 1.0


@pytest.mark.parametrize("answer, final", [("y", "approved (person)"), ("N", "kept_previous (person)")])
def test_approve_answers_y_and_n_as_the_cli_records_them(tmp_path, stubs, answer, final):  # noqa: F811
    from langgraph.types import Command

    run_dir = tmp_path / "run"
    ctx = {"preset": "smoke", "engineer": "fixed", "stages": 2, "approve": True, "run_dir": str(run_dir),
           "feasibility_n": 4, "train": {"instances_per_stage": 8}}
    g, cfg = _server_graph(), {"configurable": {"thread_id": f"t-{answer}"}}
    out = asyncio.run(g.ainvoke({}, cfg, context=ctx))
    proposed = out["__interrupt__"][0].value["proposed"]
    out = asyncio.run(g.ainvoke(Command(resume=answer), cfg, context=ctx))
    assert "__interrupt__" not in out and out["final_metrics"]
    assert json.loads((run_dir / "stage_0" / "validation.json").read_text())["final"] == final
    stage0 = json.loads((run_dir / "stage_0" / "config.json").read_text())
    stage1 = json.loads((run_dir / "stage_1" / "config.json").read_text())
    assert stage1["sizes"] == (proposed["sizes"] if answer == "y" else stage0["sizes"])


def _children(run_dir: Path) -> list[int]:
    """PIDs of the stage child processes (`python -m trainer.child ...`) training in `run_dir`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "trainer.child" in cmd and str(run_dir) in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_langgraph_dev_smoke_loop_with_approval_through_the_sdk(tmp_path, dev_server):
    """The official SDK against a real `langgraph dev`, the whole loop through the server: a two-stage smoke loop (real training and evaluation, as
    small as they go) with `approve` in the context pauses before stage 1's apply in an interrupt; resumed with
    "y" (no context sent again: the thread's own run goes on), it runs to the report, and validation.json records
    the person's decision as `--approve` does."""
    from langgraph_sdk import get_client

    run_dir = tmp_path / "run"
    ctx = {"preset": "smoke", "engineer": "fixed", "run_dir": str(run_dir), "stages": 2, "approve": True,
           "eval_limit": 2, "final_limit": 2, "eval_max_tokens": 16, "feasibility_n": 4,
           "train": {"max_steps": 1, "sft_warm_start": False, "instances_per_stage": 4,
                     "max_completion_length": 16}}

    async def go():
        client = get_client(url=dev_server)
        thread = (await client.threads.create())["thread_id"]
        first = await asyncio.wait_for(
            client.runs.wait(thread, "env_engineer", input={}, context=ctx, raise_error=False), 600)
        paused = await client.threads.get_state(thread)
        if "__error__" in first or paused["next"] != ["apply"]:
            return first, paused, None, None
        done = await asyncio.wait_for(
            client.runs.wait(thread, "env_engineer", command={"resume": "y"}, raise_error=False), 600)
        return first, paused, done, await client.threads.get_state(thread)

    first, paused, done, final = asyncio.run(go())
    assert "__error__" not in first, first
    assert paused["next"] == ["apply"], paused
    (pause,) = [i for t in paused["tasks"] for i in t["interrupts"]]
    assert pause["value"]["stage"] == 1 and pause["value"]["proposed"]["sizes"], pause
    assert "__error__" not in done, done
    assert final["next"] == [] and final["values"]["final_metrics"]["final/n"] == 2
    validation = json.loads((run_dir / "stage_0" / "validation.json").read_text())
    assert validation["final"] == "approved (person)"
    assert [r["decision"] for r in validation["decisions"] if r.get("by") == "person"] == ["approved (person)"]
    applied = json.loads((run_dir / "stage_1" / "config.json").read_text())
    assert applied["sizes"] == pause["value"]["proposed"]["sizes"]
    assert (run_dir / "report.md").read_text().startswith(f"# Run report: {run_dir.name}")
    assert (run_dir / "stage_1" / "checkpoint").is_dir() and (run_dir / "tb").is_dir()  # real training, tracked


@pytest.mark.slow
def test_cancelling_a_run_stops_its_training_stage_and_keeps_the_step(tmp_path, dev_server):
    """A run cancelled through the SDK while its stage trains: the stage's child process is gone within 30 s
    (the step under way is saved if it ends within its grace, else ended inside), and what was saved stays: the
    complete in-stage checkpoints a resume continues from."""
    from langgraph_sdk import get_client

    from trainer import resume as sr

    run_dir = tmp_path / "run"
    ctx = {"preset": "smoke", "engineer": "fixed", "run_dir": str(run_dir), "stages": 1,
           "train": {"max_steps": 500, "sft_warm_start": False, "instances_per_stage": 8,
                     "max_completion_length": 16, "save_steps": 1}}
    trl = run_dir / "stage_0" / "trl"
    log = run_dir / "stage_0" / "logs" / "train.log"

    async def go():
        client = get_client(url=dev_server)
        thread = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread, "env_engineer", input={}, context=ctx)
        deadline = time.monotonic() + 300
        while not (_children(run_dir) and log.is_file() and "step 1:" in log.read_text(errors="replace")):
            assert time.monotonic() < deadline, "the stage did not train a step within 300 s"
            await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await client.runs.cancel(thread, run["run_id"])
        while _children(run_dir) and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.2)
        gone_s = time.monotonic() - t0
        while (await client.runs.get(thread, run["run_id"]))["status"] in ("pending", "running"):
            await asyncio.sleep(0.5)
        return gone_s, (await client.runs.get(thread, run["run_id"]))["status"]

    gone_s, status = asyncio.run(go())
    print(f"training child gone {gone_s:.1f} s after the cancel; run {status}")
    assert gone_s < 30, f"the training child ran on {gone_s:.1f} s after the cancel"
    assert status in ("interrupted", "error"), status
    saved = [step for step, folder in sr.checkpoints(trl) if (folder / sr.MARKER).is_file()]
    assert saved and max(saved) < 500, saved  # kept for a resume
    assert not (run_dir / "stage_0" / "checkpoint").exists()  # the stage itself did not finish
