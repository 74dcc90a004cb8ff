"""A real vLLM server on the embedded model, and the server manager's start-up and clean-up paths.

Tests on the real server take the ``vllm_server`` / ``vllm_installed`` fixtures, which fail when vLLM is
missing (skip with ALLOW_NO_VLLM=1). The clean-up tests run a stand-in for ``vllm serve`` and need no vLLM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import jsonschema
import pytest

from llm_backends.vllm_server import VLLMServer, VLLMStartError

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
def test_plain_text(vllm_server):
    chat = vllm_server.client()
    r = chat.chat(CAPITAL, max_tokens=24)
    assert "Paris" in r.text
    assert r.model == vllm_server.model_name == "smollm2"
    assert r.prompt_tokens > 5 and 0 < r.completion_tokens <= 24 and r.attempts == 1


@pytest.mark.slow
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
def test_batch_in_order(vllm_server):
    # Each prompt is longer than the one before, so the prompt token counts the server reports for the
    # answers rise strictly in input order only if every answer sits at its own prompt's index (the 135M
    # model does not repeat codes reliably enough to check the answer texts instead).
    codes = ["alpha-17", "bravo-42", "charlie-63", "delta-88", "echo-29", "foxtrot-51"]
    batch = [[{"role": "user", "content": f"Repeat exactly: {c}" + " Thanks." * i}] for i, c in enumerate(codes)]
    out = vllm_server.client(max_concurrency=3).chat_batch(batch, max_tokens=8)
    assert len(out) == len(batch) and all(0 < r.completion_tokens <= 8 for r in out)
    counts = [r.prompt_tokens for r in out]
    assert all(a < b for a, b in zip(counts, counts[1:], strict=False)), counts


def _modified_copy(src, dst):
    """A copy of the model in ``src`` whose final norm is negated: every logit flips sign."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).symlink_to(f)
    for f in src.glob("*.safetensors"):
        tensors = load_file(f)
        if "model.norm.weight" in tensors:
            tensors["model.norm.weight"] = -tensors["model.norm.weight"]
        save_file(tensors, dst / f.name, metadata={"format": "pt"})


@pytest.mark.slow
def test_lora_adapter_and_weight_reload(vllm_server, embedded_model_path, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base_text = vllm_server.client().chat(CAPITAL, max_tokens=8).text

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(embedded_model_path, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # PEFT starts B at zero (a no-op adapter): make it change the model
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    del base, peft_model
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())

    t0 = time.monotonic()
    vllm_server.load_lora("tiny", tmp_path / "adapter")
    assert time.monotonic() - t0 < 30
    r = vllm_server.client(model="tiny").chat(CAPITAL, max_tokens=8)
    assert r.model == "tiny" and r.completion_tokens > 0
    assert r.text != base_text, "an adapter with non-zero B must change the greedy answer"
    vllm_server.unload_lora("tiny")
    assert "tiny" not in vllm_server.loras
    assert vllm_server.client().chat(CAPITAL, max_tokens=8).text == base_text

    # full weights in place: modified weights change the answer, the originals bring it back
    chat = vllm_server.client()
    before = chat.chat(CAPITAL, max_tokens=16).text
    _modified_copy(embedded_model_path, tmp_path / "negated")
    vllm_server.reload_weights(tmp_path / "negated")
    try:
        assert chat.chat(CAPITAL, max_tokens=16).text != before
    finally:
        vllm_server.reload_weights(embedded_model_path)  # other tests share this server
    assert chat.chat(CAPITAL, max_tokens=16).text == before


@pytest.mark.slow
def test_start_failure_raises_with_the_log_tail(vllm_installed, embedded_model_path, tmp_path):
    server = VLLMServer(embedded_model_path, log_path=tmp_path / "bad.log", extra_args=["--no-such-flag"],
                        startup_timeout_s=300)
    with pytest.raises(VLLMStartError) as info:
        server.start()
    msg = str(info.value)
    assert "exited with code" in msg and "no-such-flag" in msg and str(tmp_path / "bad.log") in msg
    assert not server.running


# A stand-in for `vllm serve`: a process group whose leader answers /health (and starts a child that
# sleeps), so the clean-up paths can be tested without vLLM and without paying for a real server.
FAKE_CLASS = textwrap.dedent(
    """
    import sys
    from llm_backends.vllm_server import VLLMServer

    class Fake(VLLMServer):
        def command(self):
            code = ("import http.server, sys, subprocess;"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
                    "h = type('H', (http.server.BaseHTTPRequestHandler,), {'do_GET': lambda s: (s.send_response(200), s.end_headers())});"
                    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), h).serve_forever()")
            return [sys.executable, "-c", code, str(self.port)]
    """
)
# The owner process: python owner.py MODEL LOG MODE; prints the servers' process-group ids on one line.
#   main:   one server started on the main thread, then waits
#   thread: one server started on another thread first (no signal handlers can be installed there), then
#           one on the main thread (which installs them), then waits
#   drop:   one server started on the main thread and dropped (no reference kept), then a normal exit
FAKE_OWNER = FAKE_CLASS + textwrap.dedent(
    """
    import gc, threading, time
    from pathlib import Path
    import llm_backends.vllm_server as vs
    vs.vllm_available = lambda: True  # the stand-in needs no vLLM

    model, log, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    new = lambda: Fake(model, log_path=log, startup_timeout_s=60).start()
    servers = []
    if mode == "thread":
        t = threading.Thread(target=lambda: servers.append(new()))
        t.start()
        t.join()
    servers.append(new())
    print(*(s._proc.pid for s in servers), flush=True)
    if mode == "drop":
        servers.clear()
        gc.collect()
        sys.exit(0)
    time.sleep(600)
    """
)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _owner(tmp_path, mode: str) -> tuple[subprocess.Popen, list[int]]:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    script = tmp_path / "owner.py"
    script.write_text(FAKE_OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), str(model), str(tmp_path / "log.txt"), mode],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    return owner, [int(x) for x in owner.stdout.readline().split()]


def _wait_gone(pgids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(map(_group_alive, pgids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [g for g in pgids if _group_alive(g)]


def _kill_groups(pgids: list[int]) -> None:
    for g in pgids:
        if _group_alive(g):
            os.killpg(g, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_server_process_group(sig, tmp_path):
    owner, pgids = _owner(tmp_path, "main")
    try:
        assert len(pgids) == 1 and _group_alive(pgids[0])
        owner.send_signal(sig)
        owner.wait(30)
        assert _wait_gone(pgids) == [], "server process group survived its owner's signal"
    finally:
        owner.kill()
        _kill_groups(pgids)


def test_signal_stops_a_server_started_off_the_main_thread(tmp_path):
    """The first server starts on a worker thread, where no handler can be installed; the handlers the
    next main-thread start installs must stop both."""
    owner, pgids = _owner(tmp_path, "thread")
    try:
        assert len(pgids) == 2 and all(map(_group_alive, pgids))
        owner.send_signal(signal.SIGTERM)
        owner.wait(30)
        assert _wait_gone(pgids) == [], "a server process group survived its owner's SIGTERM"
    finally:
        owner.kill()
        _kill_groups(pgids)


def test_a_dropped_server_is_still_stopped_at_exit(tmp_path):
    owner, pgids = _owner(tmp_path, "drop")
    try:
        assert owner.wait(30) == 0
        assert _wait_gone(pgids) == [], "a server nobody referenced survived its owner's exit"
    finally:
        owner.kill()
        _kill_groups(pgids)


def test_off_main_thread_start_installs_no_handler_until_a_main_thread_call(monkeypatch):
    import threading

    from llm_backends import server_cleanup as vs

    monkeypatch.setattr(vs, "_HANDLERS_INSTALLED", False)
    chained = []
    monkeypatch.setattr(vs, "_chain_handler", chained.append)
    monkeypatch.setattr(vs, "_ATEXIT_REGISTERED", True)
    server = object.__new__(VLLMServer)
    t = threading.Thread(target=vs.register, args=(server,))
    t.start()
    t.join()
    try:
        assert chained == [] and not vs._HANDLERS_INSTALLED and server in vs.live_servers()
        assert vs.install_signal_handlers() and chained == [signal.SIGINT, signal.SIGTERM]
        assert vs.install_signal_handlers() and len(chained) == 2  # once
    finally:
        vs.unregister(server)
    assert server not in vs.live_servers()


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_server_gets_sigterm_when_its_owner_is_killed(tmp_path):
    owner, pgids = _owner(tmp_path, "main")
    pgid = pgids[0]
    try:
        owner.kill()  # SIGKILL: no handler runs in the owner
        owner.wait(10)
        deadline = time.monotonic() + 10
        while _pid_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(pgid), "server leader survived its owner's SIGKILL"
    finally:
        _kill_groups(pgids)


def test_context_manager_stops_the_group_even_on_error(tmp_path, monkeypatch):
    monkeypatch.setattr("llm_backends.vllm_server.vllm_available", lambda: True)  # the stand-in needs no vLLM
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    ns: dict = {}
    exec(FAKE_CLASS, ns)
    with pytest.raises(RuntimeError, match="boom"):
        with ns["Fake"](model, log_path=tmp_path / "log.txt", startup_timeout_s=60) as server:
            pgid = server._proc.pid
            assert server.base_url.startswith("http://127.0.0.1:")
            raise RuntimeError("boom")
    assert _wait_gone([pgid]) == []


@pytest.mark.slow
def test_kept_server_follows_the_checkpoint(vllm_server, embedded_model_path, tmp_path, monkeypatch):
    """open_policy(keep_server=True) reuses one server: same weights as is, new full weights reloaded in
    place, a LoRA adapter loaded by name. The session server plays the kept one (no second start)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from llm_backends import policy
    from llm_backends.engineers import open_engineer

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


def test_a_kept_server_marks_each_later_use_in_its_log(tmp_path, monkeypatch):
    """The kept server logs to its first caller's file: each later use writes where it starts there, and
    a pointer to that log into the log file it would have used."""
    from llm_backends import policy

    weights = tmp_path / "stage_1"
    weights.mkdir()
    (weights / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    first_log = tmp_path / "stage_0" / "policy-vllm.log"
    first_log.parent.mkdir()
    first_log.write_text("=== vllm serve ...\n")

    class Kept:  # stands in for the running VLLMServer started by stage 0
        running, enable_lora, max_lora_rank, model_name = True, True, 16, "kept"
        model_path, log_path, base_url = weights, first_log, "http://127.0.0.1:1/v1"

        def note(self, text):
            with open(self.log_path, "a") as f:
                f.write(f"=== {text}\n")

        def reload_weights(self, path):
            pass

        def client(self, **kw):
            return "chat"

    monkeypatch.setitem(policy._KEPT, "server", Kept())
    monkeypatch.setitem(policy._KEPT, "weights", tmp_path / "stage_0_weights")
    later_log = tmp_path / "stage_1" / "logs" / "policy-vllm.log"
    assert policy._kept_client(weights, None, later_log, None, "policy", 4) == "chat"
    assert f"now serving kept: {weights}" in first_log.read_text()
    assert later_log.read_text() == f"served by the kept vLLM server on {Kept.base_url}; its log is {first_log}\n"


@pytest.mark.slow
def test_an_idle_connection_outlives_the_clients_pool_expiry(vllm_server):
    """The server keeps an idle HTTP/1.1 connection open longer than the openai client's pool reuses one (httpx's
    keepalive_expiry, 5 s), so the client, not the server, retires it: with vLLM's default 5 s on both sides a request
    sent on a connection the server was closing failed as RemoteProtocolError. A second request on one connection
    after 6 s idle still gets its answer (vLLM's default would have closed it at 5 s)."""
    import http.client
    from urllib.parse import urlsplit

    from llm_backends.vllm_server import SERVER_KEEP_ALIVE_S

    assert SERVER_KEEP_ALIVE_S > 5 and vllm_server.environment()["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "60"
    url = urlsplit(vllm_server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", "/v1/models")
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        sock = conn.sock
        time.sleep(6.0)
        conn.request("GET", "/v1/models")  # http.client does not reconnect on its own: a closed socket fails here
        second = conn.getresponse()
        assert second.status == 200 and second.read() and conn.sock is sock
    finally:
        conn.close()
