"""Untrusted text stays inert, and a fork never writes into its donor, fast and in-process.

- An engineer (a scripted OpenAI-compatible endpoint) replies with `<script>`, an `<img onerror>`, ANSI
  clear-screen and title sequences, a fake heading and the API key, raw and inside JSON `\\u` escapes: none
  of them is in any file of the run folder (graph.sqlite included) or on the terminal of `--approve`;
  the endpoint's URL credentials are masked in settings.json and a resume needs the full URL again.
- `python -m nodes.report` on JSON of the wrong type writes a report, no traceback.
- A fork (`--stage0-from`) whose stage 0 is evaluated again leaves the donor's stage-0 files byte-identical.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from env import SIZES
from graph import run as gr
from tests.support.graph_stubs import SET
from tests.support.run_folder import files

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-proj-Zq8xYv7Wt6Us5Rr4Qp3Lm2"
BAD = ["<script>", "<img", "\x1b[2J", "\x1b]0;", "\x07", KEY, KEY[8:20]]


def hostile_reply() -> str:
    sizes = {str(n): {"data_ratio": 0.125, "hole_ratio": 0.1, "wait_ratio": 0.25} for n in SIZES}
    rationale = ("<script>alert(1)</script><img src=x onerror=alert(2)>\x1b[2J\x1b]0;owned\x07\n"
                 f"# Fake heading\n=====\nmy key is {KEY}")
    body = json.dumps({"sizes": sizes, "rationale": rationale})  # ESC and BEL as \u001b / \u0007 in the JSON
    return f"Sure! \x1b[2J<script>x()</script> the key {KEY}\n{body}"


def test_hostile_reply_leaves_nothing_in_the_run_folder_or_on_the_terminal(tmp_path, stubs, monkeypatch,  # noqa: F811
                                                                          capsys, fake_openai):
    from nodes.report import write_report

    fake_openai.default = hostile_reply()
    url = fake_openai.base_url.replace("http://", "http://me:pw-Hidden-77@")
    monkeypatch.setenv("ENGINEER", "mylab")
    monkeypatch.setenv("ENGINEER_BASE_URL", url)
    monkeypatch.setenv("ENGINEER_MODEL", "fake-model")
    monkeypatch.setenv("ENGINEER_API_KEY", KEY)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    run_dir = tmp_path / "run"
    assert gr.main(["--run-dir", str(run_dir), "--stages", "2", "--approve",
                    "--set", "engineer_max_attempts=1", *SET]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "[y] yes" in err and "rationale:" in err  # the --approve prompt showed the rationale
    for bad in BAD:
        assert bad not in err, bad
    write_report(run_dir)  # the real report (the stub wrote a placeholder)
    report = (run_dir / "report.md").read_text()
    assert "&lt;script&gt;" in report and "\n# Fake" not in report and "> \\# Fake heading" in report
    assert json.loads((run_dir / "stage_0" / "validation.json").read_text())["final"] == "approved (person)"
    assert (run_dir / "stage_0" / "engineer_reply.md").is_file() and (run_dir / "graph.sqlite").is_file()
    for name, data in files(run_dir).items():
        if name.endswith(".png"):  # binary: control bytes are part of the format
            continue
        for bad in BAD + ["pw-Hidden-77"]:
            if bad == "\x07" and (name == "graph.sqlite" or ".tfevents." in name):  # a lone byte 7 is part of
                # msgpack/sqlite/TensorBoard record encodings (every other needle is still looked for there)
                continue
            assert bad.encode() not in data, (name, bad)
    saved = json.loads((run_dir / "settings.json").read_text())["engineer_base_url"]
    assert saved == url.replace("pw-Hidden-77", "***")
    # a resume takes the full URL from the environment again, and refuses without it
    monkeypatch.setenv("ENGINEER_BASE_URL", fake_openai.base_url)
    assert gr.main(["--resume", str(run_dir)]) == gr.EXIT_BAD_SETTINGS
    assert "ENGINEER_BASE_URL" in capsys.readouterr().err


def test_report_survives_json_of_the_wrong_type(tmp_path):
    run = tmp_path / "run"
    (run / "stage_0").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "settings.json").write_text("[1, 2]")
    (run / "stage_0" / "metrics.json").write_text('["eval/valid_rate", 0.5]')
    (run / "stage_0" / "config.json").write_text('{"sizes": {"3": "wide", "4": {"data_ratio": "x"}}}')
    (run / "stage_0" / "validation.json").write_text('{"decisions": "many"}')
    (run / "stage_0" / "env_stats.json").write_bytes(b"\xff\xfe binary")
    (run / "final" / "metrics.json").write_text('{"final/n": 3, "by_agents": [1], "final/valid_rate": "high"}')
    r = subprocess.run([sys.executable, "-m", "nodes.report", str(run)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "# Run report: run" in (run / "report.md").read_text()
    r = subprocess.run([sys.executable, "-m", "nodes.report", str(run / "nope")], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr


def test_a_fork_that_evaluates_stage_0_again_never_writes_into_its_donor(tmp_path, stubs):  # noqa: F811
    """The fork's stage_0 files are hard links to the donor's; evaluate rewrites eval.jsonl and metrics.json
    (a fork's stage 0 evaluated again) through atomic writes: new files in the fork, the donor's unchanged."""
    import os

    from graph.settings import Settings
    from graph.stage0 import check_donor, seed_from_donor
    from nodes.evaluate import evaluate
    from tests.support.node_helpers import runtime, scripted_policy

    donor = tmp_path / "donor"  # a donor keeps its stage-0 weights (the smoke preset alone keeps only the last)
    assert gr.main(["--run-dir", str(donor), "--stages", "2", *SET, "--set", "keep_checkpoints=all"]) == 0
    assert (donor / "stage_0" / "checkpoint" / "model.safetensors").is_file()
    before = files(donor / "stage_0")
    inodes = {p: os.stat(donor / "stage_0" / p).st_ino for p in before}
    dsettings = Settings.load(donor / "settings.json")
    settings = dsettings.model_copy(update={"engineer": "random", "run_dir": tmp_path / "fork", "run_id": "fork"})
    (tmp_path / "fork").mkdir()
    seed_from_donor(check_donor(donor, settings), tmp_path / "fork", settings)
    assert os.stat(tmp_path / "fork" / "stage_0" / "eval.jsonl").st_ino == inodes["eval.jsonl"]  # linked

    from env import load_split

    policy = scripted_policy(load_split(settings.eval_split), lambda i, inst: "no plan")
    evaluate({"stage": 0, "checkpoint": None}, runtime(settings, tmp_path / "fork"), model=policy)
    assert files(donor / "stage_0") == before
    assert {p: os.stat(donor / "stage_0" / p).st_ino for p in before} == inodes
    assert (tmp_path / "fork" / "stage_0" / "eval.jsonl").read_bytes() != before["eval.jsonl"]
