"""A base URL with a query (`.../v1?api_key=...`): the query is sent as parameters of every request (never
glued before the path), and its values are masked wherever the URL is written (settings.json, TensorBoard's
settings, error messages, the engineer's description); a resume takes the full URL from the environment again."""

from __future__ import annotations

import base64
import json

import pytest

from graph import run as gr
from llm_backends.base import ChatError
from llm_backends.engineers import check_engineer_env
from llm_backends.openai_chat import OpenAIChat
from llm_backends.redact import has_masked_credentials, mask_url
from tests.support.fakeopenai import Fault
from tests.support.graph_stubs import PROPOSAL, SET
from tests.support.run_folder import files

QKEY = "qk-Hidden-0123456789"
HI = [{"role": "user", "content": "hi"}]


def _url(base: str) -> str:
    return base.replace("http://", "http://me:pw-Secret-42@") + f"?api_key={QKEY}&api-version=2024-06-01"


def test_mask_url_masks_the_query_and_the_password():
    url = f"https://me:pw@host:8000/v1?api_key={QKEY}&flag#frag"
    masked = mask_url(url)
    assert masked == "https://me:***@host:8000/v1?api_key=***&***#***"
    assert QKEY not in masked and has_masked_credentials(masked) and not has_masked_credentials(url)
    assert mask_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    assert not has_masked_credentials("http://127.0.0.1:8000/v1")


def test_the_query_goes_with_every_request_and_the_path_stays_whole(fake_openai):
    fake_openai.script("the reply")
    chat = OpenAIChat(_url(fake_openai.base_url), "fake-model", api_key="sk-test-key-123456", backend="fake")
    assert chat.chat(HI).text == "the reply"
    req = fake_openai.chat_requests[-1]
    assert req["path"] == "/v1/chat/completions"
    assert req["query"] == {"api_key": QKEY, "api-version": "2024-06-01"}
    # the URL's user and password go as HTTP basic auth, as httpx sends them
    assert base64.b64decode(req["headers"]["authorization"].split()[1]) == b"me:pw-Secret-42"
    assert QKEY not in repr(chat) and "pw-Secret-42" not in repr(chat)


def test_a_query_value_quoted_by_the_server_is_masked_in_the_error(fake_openai):
    fake_openai.script(Fault.status_code(404, f"no project for api_key={QKEY}"))
    chat = OpenAIChat(_url(fake_openai.base_url), "fake-model", backend="fake", timeout_s=2)
    with pytest.raises(ChatError) as info:
        chat.chat(HI)
    assert "HTTP 404" in str(info.value) and QKEY not in str(info.value)


def test_the_engineer_description_masks_the_query(fake_openai):
    spec = check_engineer_env("mylab", {"ENGINEER_BASE_URL": _url(fake_openai.base_url),
                                        "ENGINEER_MODEL": "fake-model"})
    assert QKEY not in spec.describe() and "api_key=***" in spec.describe()


def test_a_run_never_writes_the_query_and_resumes_with_the_full_url(tmp_path, stubs, monkeypatch,  # noqa: F811
                                                                   capsys, fake_openai):
    fake_openai.default = json.dumps(PROPOSAL)
    url = _url(fake_openai.base_url)
    monkeypatch.setenv("ENGINEER", "mylab")
    monkeypatch.setenv("ENGINEER_BASE_URL", url)
    monkeypatch.setenv("ENGINEER_MODEL", "fake-model")
    run_dir = tmp_path / "run"
    assert gr.main(["--run-dir", str(run_dir), "--stages", "2", *SET]) == 0, capsys.readouterr().err
    assert fake_openai.chat_requests and all(r["path"] == "/v1/chat/completions" and r["query"]["api_key"] == QKEY
                                             for r in fake_openai.chat_requests)
    saved = json.loads((run_dir / "settings.json").read_text())["engineer_base_url"]
    assert saved == mask_url(url) and "api_key=***" in saved
    err = capsys.readouterr().err
    for name, data in files(run_dir).items():
        for bad in (QKEY, "pw-Secret-42"):
            assert bad.encode() not in data, (name, bad)
    assert QKEY not in err and "pw-Secret-42" not in err
    # a resume needs the full URL again: the masked one in settings.json cannot reach the engineer
    monkeypatch.setenv("ENGINEER_BASE_URL", fake_openai.base_url)
    assert gr.main(["--resume", str(run_dir)]) == gr.EXIT_BAD_SETTINGS
    assert "set ENGINEER_BASE_URL to the full URL to resume" in capsys.readouterr().err
