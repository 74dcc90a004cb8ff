"""--approve: the proposal as an old -> new table per size, explicit y / n / e answers
(Enter alone and a path are asked again, never taken), e opens $EDITOR on a prefilled file whose result is
re-validated, and the applied config is confirmed. Stub nodes (tests/test_graph_wiring.py): fast."""

from __future__ import annotations

import io
import json
import sys

import pytest

from env import SIZES
from families.mapf import config_table
from graph import approve, loop
from tests.support.graph_stubs import PROPOSAL, settings_for, sizes


def _run(monkeypatch, answers: str, settings, run_dir):
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    return loop.run_graph(run_dir, settings, resume=False)


def _editor(tmp_path, monkeypatch, body: str):
    """EDITOR = a tiny shell script; `body` runs with the file to edit as $1 (it also saves the prefill)."""
    script = tmp_path / "editor.sh"
    script.write_text(f"#!/bin/sh\ncp \"$1\" {tmp_path}/prefilled.json\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(script))
    monkeypatch.delenv("VISUAL", raising=False)


def test_config_table_shows_old_to_new_per_size():
    old = {"sizes": sizes({3: 1.0})}
    new = {"sizes": sizes({3: 0.5, 4: 0.5}, wait=0.5)}
    table = config_table(old, new).splitlines()
    assert table[0].split() == ["size", "data", "hole", "wait"]
    rows = {line.split()[0]: line for line in table[2:]}
    assert set(rows) == {f"{n}x{n}" for n in SIZES}
    assert "1.000 -> 0.500" in rows["3x3"] and "0.250 -> 0.500" in rows["3x3"] and rows["3x3"].endswith("*")
    assert "0.000 -> 0.500" in rows["4x4"]
    assert "0.100  =" in rows["5x5"] and "0.000  =" in rows["5x5"]  # unchanged knobs: no arrow
    assert "-> 0.000" not in rows["5x5"].split("0.100")[0]


def test_enter_and_a_path_are_not_answers_y_applies(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    settings, run_dir = settings_for(tmp_path, stages=2, approve="true")
    (tmp_path / "y").write_text(json.dumps({"sizes": sizes({9: 1.0})}))  # a file named y must not be read
    monkeypatch.chdir(tmp_path)
    _run(monkeypatch, f"\n{tmp_path / 'y'}\ny\n", settings, run_dir)
    err = capsys.readouterr().err
    assert err.count(approve.APPROVE_PROMPT) == 3  # Enter and the path were asked again
    assert "please answer y, n or e" in err
    assert "size  data" in err and "->" in err  # the table, not vertical JSON
    assert '"data_ratio"' not in err
    assert "[approve] applying the engineer's config to stage 1" in err
    cfg = json.loads((run_dir / "stage_1" / "config.json").read_text())["sizes"]
    assert cfg["3"]["data_ratio"] == pytest.approx(0.5) and cfg["9"]["data_ratio"] == 0  # the proposal, not ./y
    doc = json.loads((run_dir / "stage_0" / "validation.json").read_text())
    assert doc["final"] == "approved (person)"


def test_n_keeps_and_confirms(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    settings, run_dir = settings_for(tmp_path, stages=2, approve="true")
    _run(monkeypatch, "n\n", settings, run_dir)
    assert "[approve] keeping stage 0's config for stage 1" in capsys.readouterr().err
    s0 = json.loads((run_dir / "stage_0" / "config.json").read_text())["sizes"]
    assert json.loads((run_dir / "stage_1" / "config.json").read_text())["sizes"] == s0


def test_e_opens_editor_on_prefilled_file_and_revalidates(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    settings, run_dir = settings_for(tmp_path, stages=2, approve="true")
    # first edit: infeasible-to-parse garbage is refused and asked again; second: a valid config is applied
    (tmp_path / "good.json").write_text(json.dumps({"sizes": sizes({6: 1.0}, wait=0.5)}))
    _editor(tmp_path, monkeypatch,
            f'if [ -f {tmp_path}/once ]; then cp {tmp_path}/good.json "$1"; '
            f'else touch {tmp_path}/once; echo "{{\\"sizes\\": 7}}" > "$1"; fi')
    _run(monkeypatch, "e\ne\n", settings, run_dir)
    err = capsys.readouterr().err
    prefilled = json.loads((tmp_path / "prefilled.json").read_text())
    assert prefilled["sizes"]["3"]["data_ratio"] == pytest.approx(PROPOSAL["sizes"]["3"]["data_ratio"])
    assert "cannot use the edit" in err and err.count(approve.APPROVE_PROMPT) == 2
    assert "[approve] applying the edited config to stage 1" in err
    cfg = json.loads((run_dir / "stage_1" / "config.json").read_text())["sizes"]
    assert cfg["6"]["data_ratio"] == pytest.approx(1.0) and cfg["6"]["wait_ratio"] == pytest.approx(0.5)
    assert cfg["3"]["data_ratio"] == 0
    person = json.loads((run_dir / "stage_0" / "validation.json").read_text())["decisions"][-1]
    assert person["decision"] == "edited (person)" and person["feasibility"]["ok"]


def test_e_without_editor_is_one_line_and_asks_again(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    settings, run_dir = settings_for(tmp_path, stages=2, approve="true")
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    _run(monkeypatch, "e\nn\n", settings, run_dir)
    err = capsys.readouterr().err
    assert "no editor: set EDITOR" in err and err.count(approve.APPROVE_PROMPT) == 2


def test_another_tasks_proposal_is_shown_and_edited_by_its_levels(tmp_path):
    """A reasoning-gym run's proposal is its level shares (`{"levels": ...}`), not MAPF's sizes: the answer goes
    through the task's strict check, else its projection, and validation.json records the levels and their diff.
    (tests/test_rg_loop.py runs the same through the real CLI, killed and resumed at the prompt.)"""
    from graph.settings import build_settings

    settings = build_settings({"task": "rg:basic_arithmetic:num_terms=2,num_digits=1-2", "engineer": "fixed"},
                              {"PRESET": "smoke"})
    run_dir = tmp_path / "run"
    (run_dir / "stage_0").mkdir(parents=True)
    current, proposed = {"levels": {"0": 1.0}, "num_instances": 16}, {"levels": {"0": 0.5, "1": 0.5}, "num_instances": 16}
    values = {"stage": 0, "config": current, "accepted": proposed, "decision": "accepted", "attempts": 1}

    def person() -> dict:
        return json.loads((run_dir / "stage_0" / "validation.json").read_text())["decisions"][-1]

    update, lines = approve.decide("y", values, settings, run_dir)
    assert update == {} and lines == ["[approve] applying the engineer's config to stage 1: level 0 share "
                                      "1.00->.50, level 1 share .00->.50"]
    assert person()["diff"] == {"0": {"share": {"from": 1.0, "to": 0.5}}, "1": {"share": {"from": 0.0, "to": 0.5}}}

    update, lines = approve.decide({"levels": {"0": 0.25, "1": 0.75}}, values, settings, run_dir, source="e.json")
    assert update == {"accepted": {"levels": {"0": 0.25, "1": 0.75}, "num_instances": 16},
                      "decision": "edited (person)"}
    assert lines[0] == "[approve] applying the edited config to stage 1 (accepted by validation):"
    table = lines[1].splitlines()
    assert table[0].split() == ["level", "share", "what"]
    assert table[2].split() == ["0", "1.000", "->", "0.250", "num_terms=2", "num_digits=1", "*"]
    assert table[3].split() == ["1", "0.000", "->", "0.750", "num_terms=2", "num_digits=2", "*"]
    assert person()["accepted"] == update["accepted"] and person()["feasibility"] is None

    # shares outside [0, 1] fail the strict check and are projected, as the engineer's last attempt would be
    update, lines = approve.decide('{"levels": {"0": 2, "1": 6}}', values, settings, run_dir)
    assert update["accepted"] == {"levels": {"0": 0.25, "1": 0.75}, "num_instances": 16}
    assert lines[0].startswith("the edit was projected onto allowed values: ")
    assert person()["decision"] == "edited (person)" and person()["errors"]
    # unusable: no level of this task, or a MAPF config; nothing is recorded
    before = (run_dir / "stage_0" / "validation.json").read_text()
    for bad in ({"levels": {"7": 1.0}}, {"sizes": {"3": {"data_ratio": 1.0}}}, []):
        update, lines = approve.decide(bad, values, settings, run_dir)
        assert update is None and len(lines) == 1 and lines[0].startswith("cannot use the edit: "), (bad, lines)
    assert "'7' is not a level; allowed: 0-1" in approve.decide({"levels": {"7": 1.0}}, values, settings, run_dir)[1][0]
    assert (run_dir / "stage_0" / "validation.json").read_text() == before


def test_a_first_ctrl_c_at_the_prompt_stops_the_run_there(tmp_path, monkeypatch, stubs):
    """Nothing is in flight while the run waits at the prompt (the graph is paused before apply): the first
    Ctrl-C stops the run at once (exit 130, resumable), as before the graph streams. Nothing is decided or
    applied, and --resume asks again."""
    import os
    import signal

    from graph import run as gr
    from tests.support.graph_stubs import SET

    class CtrlCAtThePrompt(io.StringIO):
        def readline(self, *args):
            os.kill(os.getpid(), signal.SIGINT)  # the person presses Ctrl-C instead of answering
            return super().readline(*args)

    monkeypatch.setattr(sys, "stdin", CtrlCAtThePrompt("y\n"))
    run_dir = tmp_path / "run"
    assert gr.main(["--run-dir", str(run_dir), "--stages", "2", "--approve", *SET]) == 130
    assert stubs.trained() == [0] and not (run_dir / "stage_1").exists()
    doc = json.loads((run_dir / "stage_0" / "validation.json").read_text())
    assert not [d for d in doc["decisions"] if d.get("by") == "person"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert gr.main(["--resume", str(run_dir)]) == 0
    assert stubs.trained() == [0, 1]
    assert json.loads((run_dir / "stage_0" / "validation.json").read_text())["final"] == "kept_previous (person)"
