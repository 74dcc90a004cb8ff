"""The env CLI's limits: a huge --n is refused with the value and the range, an error echoing a
huge or hostile field is one short line, and Ctrl-C ends with one line and no output file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from env.__main__ import MAX_ECHO, MAX_N, main

ROOT = Path(__file__).resolve().parents[1]


def test_huge_n_is_refused_naming_the_value_and_the_range(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["generate", "--config", "random", "--n", "10000000", "--seed", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "10000000" in err and f"between 0 and {MAX_N}" in err and not out.exists()


def test_error_echo_is_capped_and_free_of_control_characters(tmp_path, capsys):
    inst = tmp_path / "inst.jsonl"
    assert main(["generate", "--config", "random", "--n", "1", "--seed", "0", "--out", str(inst)]) == 0
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"id": "\x1b[2J" + "A" * 5_000_000, "text": "x"}) + "\n")
    capsys.readouterr()
    assert main(["verify", "--instances", str(inst), "--answers", str(answers), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert len(err) < MAX_ECHO + 100 and "\x1b" not in err and "more characters" in err, err[:300]


def test_ctrl_c_is_one_line_and_leaves_no_output(tmp_path):
    out = tmp_path / "big.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # SIGINT as a terminal leaves it, even when the suite itself runs in the background (`cmd &` in a
    # non-interactive shell starts with SIGINT ignored, and a child inherits that: Ctrl-C would be lost)
    proc = subprocess.Popen([sys.executable, "-m", "env", "generate", "--config", "random", "--n", "200000",
                             "--seed", "0", "--workers", "2", "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # the whole group, like a terminal's Ctrl-C: workers get it too
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "interrupted; no output was written", err
    assert not out.exists() and not list(tmp_path.glob(".big.jsonl.*"))
