"""env: config validation and projection, the CLI's error handling, and benchmark integrity."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from env import EnvConfig, list_splits, load_split, project, random_config, uniform_config, verify
from env.benchmark import DATA_DIR, BenchmarkIntegrityError
from env.config import SIZES, max_hole_ratio
from env.verify import plan_text

REPO = Path(__file__).resolve().parents[1]


def knobs(**over):
    return {str(s): {"data_ratio": 1 / 8, "hole_ratio": 0.1, "wait_ratio": 0.5, **over.get(str(s), {})} for s in SIZES}


def test_config_errors_name_field_and_bound():
    raw = {"sizes": knobs(**{"5": {"data_ratio": 1.7}})}
    with pytest.raises(ValidationError) as e:
        EnvConfig.model_validate(raw)
    msg = str(e.value)
    assert "sizes.5.data_ratio" in msg and "less than or equal to 1" in msg
    with pytest.raises(ValidationError, match=r"hole_ratio must be <= 0.33"):
        EnvConfig.model_validate({"sizes": knobs(**{"3": {"hole_ratio": 0.4}})})
    with pytest.raises(ValidationError, match="must sum to 1"):
        EnvConfig.model_validate({"sizes": knobs(**{"3": {"data_ratio": 0.5}})})
    with pytest.raises(ValidationError, match="missing"):
        EnvConfig.model_validate({"sizes": {k: v for k, v in knobs().items() if k != "7"}})
    with pytest.raises(ValidationError, match="num_agents"):
        EnvConfig.model_validate({"sizes": knobs(), "num_agents": 6})
    with pytest.raises(ValidationError, match="extra"):
        EnvConfig.model_validate({"sizes": knobs(), "colour": "blue"})


def test_projection_clips_renormalises_and_reports():
    raw = {"sizes": knobs(**{"3": {"data_ratio": -1, "hole_ratio": 0.9}, "4": {"wait_ratio": 1.7}}), "extra": 1}
    cfg, notes = project(raw)
    assert abs(sum(k.data_ratio for k in cfg.sizes.values()) - 1) < 1e-9
    assert cfg.sizes[3].data_ratio == 0 and cfg.sizes[3].hole_ratio == max_hole_ratio(3)
    assert cfg.sizes[4].wait_ratio == 1.0
    joined = "\n".join(notes)
    for needle in ("sizes.3.data_ratio: clipped -1 to 0", "capped 0.9", "sizes.4.wait_ratio: clipped 1.7",
                   "renormalised", "extra: unknown key"):
        assert needle in joined
    cfg, notes = project({"sizes": {str(s): {"data_ratio": 0, "hole_ratio": 0, "wait_ratio": 0} for s in SIZES}})
    assert all(k.data_ratio == 1 / 8 for k in cfg.sizes.values()) and "uniform" in notes[-1]
    with pytest.raises(ValueError):
        project([1, 2])
    good = uniform_config()
    assert project(good.engineer_dump()) == (good, [])


def test_random_config_is_valid_and_reproducible():
    assert random_config(0) == random_config(0) != random_config(1)
    schema = EnvConfig.engineer_schema()
    assert schema["properties"]["sizes"]["required"] == [str(s) for s in SIZES]


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "env", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("case", ["bad_json", "unknown_field", "ratio", "agents", "missing_id"])
def test_cli_bad_input_one_line_nonzero_no_output(tmp_path, case):
    inst_file = tmp_path / "inst.jsonl"
    out = tmp_path / "out.jsonl"
    if case in ("bad_json", "unknown_field", "ratio"):
        cfg = tmp_path / "cfg.json"
        body = {"bad_json": "{not json", "unknown_field": json.dumps({"sizes": knobs(), "colour": 1}),
                "ratio": json.dumps({"sizes": knobs(**{"6": {"hole_ratio": 1.7}})})}[case]
        cfg.write_text(body)
        r = run_cli("generate", "--config", str(cfg), "--n", "3", "--seed", "0", "--out", str(out), cwd=tmp_path)
        needle = {"bad_json": "not valid JSON", "unknown_field": "colour", "ratio": "sizes.6.hole_ratio"}[case]
    elif case == "agents":
        r = run_cli("generate", "--config", "random", "--n", "3", "--seed", "0", "--agents", "6", "--out", str(out),
                    cwd=tmp_path)
        needle = "--agents must be between 1 and 5"
    else:
        assert run_cli("generate", "--config", "random", "--n", "3", "--seed", "0", "--out", str(inst_file),
                       cwd=tmp_path).returncode == 0
        (tmp_path / "ans.jsonl").write_text('{"text": "<answer></answer>"}\n')
        r = run_cli("verify", "--instances", str(inst_file), "--answers", str(tmp_path / "ans.jsonl"),
                    "--out", str(out), cwd=tmp_path)
        needle = 'missing "id"'
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_cli_generate_verify_roundtrip(tmp_path):
    inst_file, ans_file, out = tmp_path / "i.jsonl", tmp_path / "a.jsonl", tmp_path / "v.jsonl"
    r = run_cli("generate", "--config", "random", "--n", "12", "--seed", "4", "--out", str(inst_file), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in inst_file.read_text().splitlines()]
    assert len(rows) == 12 and {"id", "size", "grid", "starts", "goals", "optimal_cost", "makespan", "needs_wait",
                                "plan", "seed"} <= set(rows[0])
    answers = [{"id": x["id"], "text": plan_text([[tuple(c) for c in p] for p in x["plan"]])} for x in rows]
    answers[0]["text"] = "no idea"
    ans_file.write_text("\n".join(json.dumps(a) for a in answers))
    r = run_cli("verify", "--instances", str(inst_file), "--answers", str(ans_file), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    assert verdicts[0]["failure"] == "parse_error" and verdicts[0]["reward"] == 0.0
    assert all(v["valid"] and v["optimal"] and v["reward"] == 1.0 for v in verdicts[1:])
    assert "valid 0.917" in r.stdout


def test_splits_load_verify_and_are_stratified():
    assert set(list_splits()) == {"val", "val-mini", "test", "test-mini"}
    val = load_split("val")
    assert len(val) == 200 and {i.num_agents for i in val} == {2} and {i.size for i in val} == set(SIZES)
    mini = load_split("val-mini")
    assert {i.size for i in mini} == {3, 4, 5} and {i.id for i in mini} <= {i.id for i in val}
    test = load_split("test")
    strata = {(i.tags["agents"], i.tags["wait"], i.size) for i in test}
    assert len(strata) == 3 * 3 * 8
    tm = load_split("test-mini")
    assert {(i.tags["agents"], i.tags["wait"], i.size) for i in tm} == strata
    for inst in val + test:
        v = verify(inst, plan_text(inst.plan))
        assert v.valid and v.optimal, inst.id


def test_tampered_benchmark_is_detected(tmp_path):
    d = tmp_path / "data"
    shutil.copytree(DATA_DIR, d)
    assert len(load_split("val-mini", data_dir=d)) > 0
    path = d / "val-mini.jsonl"
    path.write_text(path.read_text().replace('"optimal_cost":', '"optimal_cost": ', 1))
    with pytest.raises(BenchmarkIntegrityError, match="does not match checksums.sha256"):
        load_split("val-mini", data_dir=d)
    with pytest.raises(ValueError, match="unknown split"):
        load_split("nope")
