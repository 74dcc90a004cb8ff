"""Small faults a careful user found, each one line now: a settings.json of `{}` is refused on resume; `env
verify` with a list as an answer id names it; a `javascript:` link in the engineer's text is text in
report.md; a missing stage-0 checkpoint is named as the policy after stage 0. Fast: the slow nodes stubbed."""

from __future__ import annotations

import json
import shutil

from markdown_it import MarkdownIt

from env.__main__ import main as env_main
from graph import run as gr
from nodes.inert import for_markdown
from tests.support.graph_stubs import PROPOSAL, SET, Stubs


def new_run(run_dir, *extra: str) -> int:
    return gr.main(["--run-dir", str(run_dir), "--stages", "2", *SET, *extra])


def test_a_settings_json_of_nothing_is_refused_on_resume(tmp_path, stubs, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    stubs.crash_train_at = 1
    assert new_run(run_dir) == 1
    stubs.calls.clear()
    for text in ("{}", '{"seed": 3}'):
        (run_dir / "settings.json").write_text(text)
        capsys.readouterr()
        assert gr.main(["--resume", str(run_dir)]) == gr.EXIT_BAD_SETTINGS
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "settings.json" in err and "lacks preset, engineer" in err, err
        assert stubs.calls == []


def test_env_verify_with_a_list_as_the_answer_id_is_one_line(tmp_path, capsys):
    inst = tmp_path / "inst.jsonl"
    assert env_main(["generate", "--config", "random", "--n", "1", "--seed", "0", "--out", str(inst)]) == 0
    answers = tmp_path / "answers.jsonl"
    for bad, kind in (([1, 2], "array"), ({"a": 1}, "object")):
        answers.write_text(json.dumps({"id": bad, "text": "x"}) + "\n")
        capsys.readouterr()
        rc = env_main(["verify", "--instances", str(inst), "--answers", str(answers), "--out", str(tmp_path / "v")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "Traceback" not in err and "TypeError" not in err, err
        assert f'answers.jsonl:1: "id" is a JSON {kind} ({json.dumps(bad)})' in err, err


def _links(markdown: str) -> list[str]:
    """The link and image targets a renderer that trusts every scheme would produce."""
    md = MarkdownIt("commonmark")
    md.validateLink = lambda url: True  # as permissive as a careless viewer
    html = md.render(markdown)
    return [part.split('"', 1)[0] for part in html.split('href="')[1:] + html.split('src="')[1:]]


def test_javascript_links_are_text_in_markdown():
    hostile = ("see [docs](javascript:alert(1)) and [ref][x] and \\[esc](javascript:alert(3))\n\n"
               "[x]: javascript:alert(2)\n![i](http://e/x.png)")
    assert len(_links(hostile)) == 3  # what a viewer would follow or load, before
    assert _links(for_markdown(hostile)) == []


def test_a_javascript_link_in_the_rationale_is_inert_in_report_md(tmp_path, stubs, monkeypatch,  # noqa: F811
                                                                  capsys, fake_openai):
    from nodes.report import write_report

    fake_openai.default = json.dumps({**PROPOSAL, "rationale": "more 3x3, see [why](javascript:alert(document.cookie))"})
    monkeypatch.setenv("ENGINEER", "mylab")
    monkeypatch.setenv("ENGINEER_BASE_URL", fake_openai.base_url)
    monkeypatch.setenv("ENGINEER_MODEL", "fake-model")
    run_dir = tmp_path / "run"
    assert new_run(run_dir) == 0, capsys.readouterr().err
    write_report(run_dir)
    report = (run_dir / "report.md").read_text()
    assert "javascript:alert(document.cookie)" in report  # shown as text
    assert not [u for u in _links(report) if "javascript" in u]


def test_a_missing_stage_0_checkpoint_is_named_as_the_policy_after_stage_0(tmp_path, stubs: Stubs, capsys):
    run_dir = tmp_path / "run"
    stubs.crash_train_at = 1  # stage 1's training crashed: it trains from stage 0's checkpoint
    assert new_run(run_dir) == 1
    stubs.calls.clear()
    shutil.rmtree(run_dir / "stage_0" / "checkpoint")
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert "stage_0/checkpoint (the policy after stage 0, which stage 1 trains from) is" in err, err
    assert "after stage 1" not in err and stubs.calls == []
