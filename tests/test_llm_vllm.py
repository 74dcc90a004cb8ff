"""A real vLLM server on the embedded model, and the server manager's start-up and clean-up paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import jsonschema
import pytest

from llm.vllm_server import VLLMServer, VLLMStartError, vllm_available

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")

CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "capital": {"type": "string", "enum": ["Paris", "Lyon", "Marseille"]},
        "is_country_capital": {"type": "boolean"},
    },
    "required": ["capital", "is_country_capital"],
    "additionalProperties": False,
}


@pytest.mark.slow
@needs_vllm
def test_plain_text(vllm_server):
    chat = vllm_server.client()
    r = chat.chat(CAPITAL, max_tokens=24)
    assert "Paris" in r.text
    assert r.model == vllm_server.model_name == "smollm2"
    assert r.prompt_tokens > 5 and 0 < r.completion_tokens <= 24 and r.attempts == 1


@pytest.mark.slow
@needs_vllm
def test_schema_constrained_json(vllm_server):
    chat = vllm_server.client()
    r = chat.chat(
        [{"role": "user", "content": "Which city is the capital of France? Reply in JSON."}],
        max_tokens=64,
        json_schema=SCHEMA,
    )
    assert chat.supports_json_schema  # enforced by the server, not by the prompt fallback
    jsonschema.validate(r.parsed, SCHEMA)


@pytest.mark.slow
@needs_vllm
def test_batch_in_order(vllm_server):
    chat = vllm_server.client(max_concurrency=4)
    out = chat.chat_batch([[{"role": "user", "content": f"Repeat the number {i}."}] for i in range(4)], max_tokens=8)
    assert len(out) == 4 and all(r.completion_tokens <= 8 for r in out)


@pytest.mark.slow
@needs_vllm
def test_lora_adapter_and_weight_reload(vllm_server, embedded_model_path, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(embedded_model_path, dtype=torch.float32)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, cfg).save_pretrained(tmp_path / "adapter")
    del base

    t0 = time.monotonic()
    vllm_server.load_lora("tiny", tmp_path / "adapter")
    assert time.monotonic() - t0 < 30
    r = vllm_server.client(model="tiny").chat(CAPITAL, max_tokens=8)
    assert r.model == "tiny" and r.completion_tokens > 0
    vllm_server.unload_lora("tiny")
    assert "tiny" not in vllm_server.loras

    # full weights in place: reload the same weights, answers stay what they were
    before = vllm_server.client().chat(CAPITAL, max_tokens=16).text
    vllm_server.reload_weights(embedded_model_path)
    assert vllm_server.client().chat(CAPITAL, max_tokens=16).text == before


@pytest.mark.slow
@needs_vllm
def test_start_failure_raises_with_the_log_tail(embedded_model_path, tmp_path):
    server = VLLMServer(embedded_model_path, log_path=tmp_path / "bad.log", extra_args=["--no-such-flag"],
                        startup_timeout_s=300)
    with pytest.raises(VLLMStartError) as info:
        server.start()
    msg = str(info.value)
    assert "exited with code" in msg and "no-such-flag" in msg and str(tmp_path / "bad.log") in msg
    assert not server.running


# A stand-in for `vllm serve`: a process group whose leader answers /health, so the clean-up paths can be
# tested without paying for a real server.
FAKE_SERVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from llm.vllm_server import VLLMServer

    class Fake(VLLMServer):
        def command(self):
            code = ("import http.server, sys, subprocess;"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
                    "h = type('H', (http.server.BaseHTTPRequestHandler,), {'do_GET': lambda s: (s.send_response(200), s.end_headers())});"
                    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), h).serve_forever()")
            return [sys.executable, "-c", code, str(self.port)]

    s = Fake(Path(sys.argv[1]), log_path=Path(sys.argv[2]), startup_timeout_s=60).start()
    print(s._proc.pid, flush=True)
    time.sleep(600)
    """
)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@needs_vllm
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_server_process_group(sig, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    script = tmp_path / "owner.py"
    script.write_text(FAKE_SERVER)
    owner = subprocess.Popen(
        [sys.executable, str(script), str(model), str(tmp_path / "log.txt")],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        pgid = int(owner.stdout.readline())
        assert _group_alive(pgid)
        owner.send_signal(sig)
        owner.wait(30)
        deadline = time.monotonic() + 10
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _group_alive(pgid), "server process group survived its owner's signal"
    finally:
        owner.kill()


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@needs_vllm
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_server_gets_sigterm_when_its_owner_is_killed(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    script = tmp_path / "owner.py"
    script.write_text(FAKE_SERVER)
    owner = subprocess.Popen(
        [sys.executable, str(script), str(model), str(tmp_path / "log.txt")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    pgid = int(owner.stdout.readline())
    try:
        owner.kill()  # SIGKILL: no handler runs in the owner
        owner.wait(10)
        deadline = time.monotonic() + 10
        while _pid_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(pgid), "server leader survived its owner's SIGKILL"
    finally:
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


@needs_vllm
def test_context_manager_stops_the_group_even_on_error(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    sys.path.insert(0, str(tmp_path))
    ns: dict = {}
    exec(FAKE_SERVER.split("s = Fake(")[0], ns)  # defines Fake without starting it
    with pytest.raises(RuntimeError, match="boom"):
        with ns["Fake"](model, log_path=tmp_path / "log.txt", startup_timeout_s=60) as server:
            pgid = server._proc.pid
            assert server.base_url.startswith("http://127.0.0.1:")
            raise RuntimeError("boom")
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(pgid)


@pytest.mark.slow
@needs_vllm
def test_kept_server_follows_the_checkpoint(vllm_server, embedded_model_path, tmp_path, monkeypatch):
    """open_policy(keep_server=True) reuses one server: same weights as is, new full weights reloaded in
    place, a LoRA adapter loaded by name. The session server plays the kept one (no second start)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from llm import policy
    from llm.engineers import open_engineer

    copy = tmp_path / "stage_1_full"
    copy.mkdir()
    for f in embedded_model_path.iterdir():
        (copy / f.name).symlink_to(f)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(embedded_model_path, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "lora")
    del base

    started, reloads = [], []
    monkeypatch.setattr(VLLMServer, "start", lambda self: started.append(self) or self)
    real_reload = VLLMServer.reload_weights
    monkeypatch.setattr(VLLMServer, "reload_weights", lambda self, p: reloads.append(p) or real_reload(self, p))
    monkeypatch.setitem(policy._KEPT, "server", vllm_server)
    monkeypatch.setitem(policy._KEPT, "weights", embedded_model_path)
    try:
        with policy.open_policy(embedded_model_path, "vllm", tmp_path, keep_server=True) as chat:
            assert "Paris" in chat.chat(CAPITAL, max_tokens=16).text
        assert reloads == [] and vllm_server.running
        with policy.open_policy(copy, "vllm", tmp_path, keep_server=True) as chat:
            assert chat.chat(CAPITAL, max_tokens=4).completion_tokens > 0
        assert [p.name for p in reloads] == ["stage_1_full"]
        with open_engineer("self", checkpoint=tmp_path / "lora", base_model=None, run_dir=tmp_path,
                           env={"ENGINEER_SERVING": "vllm"}, keep_server=True) as eng:
            r = eng.chat(CAPITAL, max_tokens=4)
            assert r.model == "engineer-self"
        assert "engineer-self" in vllm_server.loras
        assert started == [] and vllm_server.running
    finally:
        if "engineer-self" in vllm_server.loras:
            vllm_server.unload_lora("engineer-self")
        if policy._KEPT.get("weights") != embedded_model_path:
            real_reload(vllm_server, embedded_model_path)  # restore the shared server's weights
