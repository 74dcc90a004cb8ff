"""Engineer backend selection from environment variables, and API keys that never leak."""

from __future__ import annotations

import logging

import pytest

from llm_backends.base import ChatError
from llm_backends.engineers import DEFAULTS, EngineerConfigError, check_engineer_env, open_engineer
from llm_backends.openai_chat import OpenAIChat
from tests.support.fakeopenai import FakeOpenAI, Fault

PLANTED = "sk-planted-Zq9xW2vK7mN4pL8r"


def test_openai_reads_its_key_and_default_model():
    spec = check_engineer_env("openai", {"OPENAI_API_KEY": "k1"})
    assert (spec.base_url, spec.model, spec.api_key, spec.key_source) == (
        "https://api.openai.com/v1", DEFAULTS["openai"][1], "k1", "OPENAI_API_KEY"
    )
    spec = check_engineer_env("openai", {"OPENAI_API_KEY": "k1", "ENGINEER_API_KEY": "k2", "ENGINEER_MODEL": "m"})
    assert (spec.api_key, spec.key_source, spec.model) == ("k2", "ENGINEER_API_KEY", "m")


def test_gemini_goes_through_its_openai_compatible_endpoint():
    spec = check_engineer_env("gemini", {"GEMINI_API_KEY": "g", "OPENAI_API_KEY": "o"})
    assert spec.base_url == "https://generativelanguage.googleapis.com/v1beta/openai/"
    assert spec.api_key == "g" and spec.model == DEFAULTS["gemini"][1]


def test_custom_endpoint_needs_url_and_model():
    env = {"ENGINEER_BASE_URL": "http://127.0.0.1:9/v1", "ENGINEER_MODEL": "qwen", "OPENAI_API_KEY": "o"}
    spec = check_engineer_env("mylab", env)
    assert (spec.kind, spec.base_url, spec.model, spec.api_key) == ("mylab", "http://127.0.0.1:9/v1", "qwen", "o")
    assert check_engineer_env("mylab", {**env, "OPENAI_API_KEY": ""}).api_key is None  # local servers need none
    # explicit values (CLI flags) win over the environment
    assert check_engineer_env("mylab", env, model="other").model == "other"
    with pytest.raises(EngineerConfigError, match="also needs ENGINEER_MODEL"):
        check_engineer_env("mylab", {"ENGINEER_BASE_URL": "http://x/v1"})
    with pytest.raises(EngineerConfigError, match="must start with http"):
        check_engineer_env("mylab", {"ENGINEER_BASE_URL": "ftp://x", "ENGINEER_MODEL": "m"})


@pytest.mark.parametrize(
    "kind,env,needle",
    [
        ("openai", {}, "ENGINEER=openai needs an API key: set ENGINEER_API_KEY or OPENAI_API_KEY"),
        ("gemini", {"OPENAI_API_KEY": "o"}, "set ENGINEER_API_KEY or GEMINI_API_KEY"),
        ("gtp5", {}, "unknown engineer 'gtp5'"),
        ("", {}, "ENGINEER is empty"),
    ],
)
def test_bad_choices_fail_with_one_clear_line(kind, env, needle):
    with pytest.raises(EngineerConfigError) as info:
        check_engineer_env(kind, env)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_open_engineer_fails_before_any_work(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr("llm_backends.vllm_server.VLLMServer.start", lambda self: started.append(self))
    monkeypatch.setattr("llm_backends.local.LocalEngine.__init__", lambda self, *a, **k: started.append(self))
    for kind in ("openai", "nonsense", "fixed"):
        with pytest.raises(EngineerConfigError):
            with open_engineer(kind, checkpoint=None, base_model=None, run_dir=tmp_path, env={}):
                pytest.fail("body must not run")
    assert started == [] and list(tmp_path.iterdir()) == []


def test_classic_engineers_have_nothing_to_check():
    for kind in ("fixed", "random", "learnability", "threshold"):
        assert check_engineer_env(kind, {}) is None


def test_self_and_base_pick_a_serving_backend():
    assert check_engineer_env("self", {"ENGINEER_SERVING": "transformers"}).backend == "transformers"
    assert check_engineer_env("base", {}).backend in ("vllm", "transformers")
    with pytest.raises(EngineerConfigError, match="ENGINEER_SERVING"):
        check_engineer_env("self", {"ENGINEER_SERVING": "tgi"})


def test_custom_engineer_end_to_end_against_a_scripted_server(tmp_path):
    with FakeOpenAI(default='{"sizes": {}}') as srv:
        env = {"ENGINEER_BASE_URL": srv.base_url, "ENGINEER_MODEL": "scripted", "ENGINEER_API_KEY": PLANTED}
        with open_engineer("scripted", checkpoint=None, base_model=None, run_dir=tmp_path, env=env) as eng:
            r = eng.chat([{"role": "user", "content": "propose"}], json_schema={"type": "object"})
        assert r.parsed == {"sizes": {}}
        assert srv.chat_requests[0]["body"]["model"] == "scripted"


def test_planted_key_never_reaches_logs_errors_repr_or_files(tmp_path, caplog, capfd):
    """The key is sent as the bearer token and nowhere else, even when the server echoes it back."""
    logfile = tmp_path / "run.log"
    handler = logging.FileHandler(logfile)
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    texts = []
    try:
        env = {"OPENAI_API_KEY": PLANTED}
        spec = check_engineer_env("openai", env)
        texts += [repr(spec), spec.describe()]
        # a provider that echoes the key in its error body (OpenAI does, partly masked), then retried faults
        with FakeOpenAI(default=Fault.status_code(401, f"Incorrect API key provided: {PLANTED}.")) as srv:
            env = {**env, "ENGINEER_BASE_URL": srv.base_url}
            with open_engineer("openai", checkpoint=None, base_model=None, run_dir=tmp_path, env=env) as eng:
                texts.append(repr(eng))
                with pytest.raises(ChatError) as info:
                    eng.chat([{"role": "user", "content": "hi"}])
                texts += [str(info.value), repr(info.value), info.value.cause]
                assert "authentication failed (401); check ENGINEER_API_KEY" in str(info.value)
            assert srv.chat_requests[0]["headers"]["authorization"] == f"Bearer {PLANTED}"
        srv2 = FakeOpenAI(default=Fault.server_error(500)).start()
        try:
            chat = OpenAIChat(srv2.base_url, "m", api_key=PLANTED, backend="openai", timeout_s=0.5,
                              total_budget_s=0.5, backoff_initial_s=0.01)
            with pytest.raises(ChatError) as info:
                chat.chat([{"role": "user", "content": "hi"}])
            texts += [str(info.value), repr(chat)]
        finally:
            srv2.stop()
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(old_level)
    out, err = capfd.readouterr()
    texts += [caplog.text, out, err]
    assert caplog.records, "DEBUG logging should have captured the HTTP traffic"
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    leaks = [t for t in texts if PLANTED in t or PLANTED[3:15] in t]
    assert leaks == []


def test_vllm_server_process_gets_no_api_key(tmp_path, monkeypatch):
    """The local server needs no secret: none reaches its environment, so none can reach its log."""
    from llm_backends.vllm_server import VLLMServer

    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.setenv("GEMINI_API_KEY", PLANTED)
    monkeypatch.setenv("ENGINEER_API_KEY", PLANTED)
    env = VLLMServer(tmp_path, log_path=tmp_path / "vllm.log").environment()
    assert PLANTED not in "".join(env.values()) and "PATH" in env
