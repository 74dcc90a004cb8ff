"""env: config validation and projection, the CLI's error handling, and benchmark integrity."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from env import EnvConfig, list_splits, load_split, project, random_config, uniform_config, verify
from env.benchmark import DATA_DIR, BenchmarkIntegrityError, sha256_file
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
    # a sum just outside the tolerance names the digits that put it outside (not "they sum to 1")
    with pytest.raises(ValidationError, match=r"they sum to 1\.000005\b"):
        EnvConfig.model_validate({"sizes": knobs(**{"3": {"data_ratio": 0.125005}})})
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
    # ratios rounded to 6 decimals can miss the sum by a few millionths: the note shows by how much
    _, notes = project({"sizes": knobs(**{"3": {"data_ratio": 0.125005}})})
    assert notes == ["data ratios summed to 1.000005; renormalised to 1"]


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_random_config_is_valid_and_reproducible(k):
    cfg = random_config(0, num_agents=k)
    assert cfg == random_config(0, num_agents=k) != random_config(1, num_agents=k)
    assert cfg.num_agents == k
    # Valid under the strict model for k agents (hole caps included), not just constructed.
    assert EnvConfig.model_validate(cfg.model_dump()) == cfg
    assert abs(sum(x.data_ratio for x in cfg.sizes.values()) - 1) < 1e-6
    for s, x in cfg.sizes.items():
        assert 0 <= x.hole_ratio <= max_hole_ratio(s, k) and 0 <= x.wait_ratio <= 1, (s, x)
    # Random, not constant: the draws spread over sizes and seeds.
    assert len({x.wait_ratio for x in cfg.sizes.values()}) > 1
    assert any(x.hole_ratio > 0 for x in cfg.sizes.values())
    if k == 5:
        assert cfg.sizes[3].hole_ratio == 0.0  # a 3x3 map with 5 agents has no room for holes
    # More agents, lower caps: the same seed's draw never asks more holes than the 2-agent one.
    base = random_config(0)
    assert all(cfg.sizes[s].hole_ratio <= base.sizes[s].hole_ratio for s in SIZES)


def test_engineer_schema_lists_every_size():
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
                                "plan", "seed", "optimal_makespan"} <= set(rows[0])
    assert all(x["optimal_makespan"] <= x["makespan"] for x in rows)
    answers = [{"id": x["id"], "text": plan_text([[tuple(c) for c in p] for p in x["plan"]])} for x in rows]
    answers[0]["text"] = "no idea"
    ans_file.write_text("\n".join(json.dumps(a) for a in answers))
    # the stored plan is a sum-of-costs optimum: optimal under soc, and under makespan where it also is one
    r = run_cli("verify", "--instances", str(inst_file), "--answers", str(ans_file), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    assert verdicts[0]["failure"] == "parse_error" and verdicts[0]["reward"] == 0.0
    assert all(v["valid"] and v["optimal"] and v["reward"] == 1.0 and v["criterion"] == "soc" for v in verdicts[1:])
    assert "valid 0.917" in r.stdout
    assert "mean reward 0.917 (R_acc, the accuracy part; no length term)" in r.stdout
    r = run_cli("verify", "--instances", str(inst_file), "--answers", str(ans_file), "--out", str(out),
                "--criterion", "makespan", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    for x, v in zip(rows[1:], verdicts[1:], strict=True):
        assert v["criterion"] == "makespan" and v["makespan"] == x["makespan"]
        assert v["optimal"] == (x["makespan"] == x["optimal_makespan"])


def test_splits_load_verify_and_are_stratified():
    assert set(list_splits()) == {"val", "val-mini", "val-small", "test", "test-extra", "test-mini", "test-cpu"}
    val = load_split("val")
    assert len(val) == 200 and {i.num_agents for i in val} == {2} and {i.size for i in val} == set(SIZES)
    mini = load_split("val-mini")
    assert {i.size for i in mini} == {3, 4, 5} and {i.id for i in mini} <= {i.id for i in val}
    test = load_split("test")
    strata = {(i.tags["agents"], i.tags["wait"], i.size) for i in test}
    assert len(strata) == 3 * (8 + 7 + 6)
    tm = load_split("test-mini")
    assert {(i.tags["agents"], i.tags["wait"], i.size) for i in tm} == strata and len(tm) == 63
    small = load_split("val-small")
    assert len(small) == 150 and {i.num_agents for i in small} == {2} and {i.size for i in small} == {3, 4, 5}
    extra, cpu = load_split("test-extra"), load_split("test-cpu")
    for inst in val + small + test + extra + cpu:
        v = verify(inst, plan_text(inst.plan))
        assert v.valid and v.optimal, inst.id
        assert inst.optimal_makespan is not None and inst.optimal_makespan <= inst.makespan, inst.id
        assert verify(inst, plan_text(inst.plan), "makespan").optimal == (inst.makespan == inst.optimal_makespan)


def _counts(insts):
    return Counter((i.tags["agents"], i.size, i.tags["wait"]) for i in insts)


# sha256 of the committed files: a rebuild that changes any instance must change these deliberately
PROTOCOL_SHA256 = {
    "test.jsonl": "363cd833fafdb002b146a1b14a003178873ec8703bef08c3b8f8fb99b039043b",
    "test-cpu.jsonl": "0afe70daa8bdc0d09c1a2201ea821c846bb00e6f7b7d2408714a88921e206be5",
}


def test_held_out_splits_follow_the_paper_protocol():
    """`test` is the paper's suite: 3 agents on 3x3-10x10, 4 on 4x4-10x10, 5 on 5x5-10x10, 50 instances per
    (agents, size, wait subset), 150 per cell, 3,150 in all; the cells outside it are `test-extra`; `test-cpu`
    holds 2 and 3 agents on 3x3-5x5 with 150 per column."""
    waits = (0.25, 0.5, 0.75)
    want = {(a, s, w): 50 for a in (3, 4, 5) for s in SIZES if s >= a for w in waits}
    test = load_split("test")
    assert _counts(test) == want and len(test) == 3150
    assert all(0.1 <= i.tags["hole"] <= 0.5 for i in test)
    assert _counts(load_split("test-extra")) == {(a, s, w): 50 for a in (4, 5) for s in SIZES if s < a for w in waits}
    assert _counts(load_split("test-cpu")) == {(a, s, w): 50 for a in (2, 3) for s in (3, 4, 5) for w in waits}
    from env.task import eval_layouts, layout

    cpu = load_split("test-cpu")
    assert not {layout(i) for i in cpu} & {layout(i) for i in test}  # two held-out splits, no shared instance
    assert {layout(i) for i in cpu if i.num_agents == 2} <= eval_layouts()  # never trained on: left out of SFT/GRPO
    for name, digest in PROTOCOL_SHA256.items():
        assert sha256_file(DATA_DIR / name) == digest, name


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


# ----------------------------------------------------------------------------------------------------
# CLI: more agents, unreadable files, malformed instances, atomic outputs, duplicate ids, help text


def main_in_process(capsys, *args):
    """Run `python -m env ARGS` in this process: (exit status, stdout, stderr)."""
    from env.__main__ import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *needles):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def no_tmp_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("k", [3, 4, 5])
def test_cli_generate_random_config_with_more_agents(tmp_path, k):
    # `--config random --agents K` draws the hole ratios under K agents' caps (it used to draw them for 2
    # agents and then fail validation, e.g. "sizes.3.hole_ratio must be <= 0.0" for 5 agents).
    out, stats = tmp_path / "i.jsonl", tmp_path / "s.json"
    r = run_cli("generate", "--config", "random", "--n", "10", "--seed", "0", "--agents", str(k), "--out", str(out),
                "--stats", str(stats), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 10
    assert all(len(x["starts"]) == len(x["goals"]) == len(x["plan"]) == k for x in rows)
    assert json.loads(stats.read_text())["num_agents"] == k


def test_cli_agents_help_and_validation_agree(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main_in_process(capsys, "generate", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "agents per instance, 1..5" in help_text
    out = tmp_path / "one.jsonl"
    rc, _, err = main_in_process(capsys, "generate", "--config", "random", "--n", "4", "--seed", "0", "--agents", "1",
                                 "--out", str(out))
    assert rc == 0, err
    assert all(len(json.loads(x)["starts"]) == 1 for x in out.read_text().splitlines())
    for bad in ("0", "6"):
        rc, _, err = main_in_process(capsys, "generate", "--config", "random", "--n", "4", "--seed", "0",
                                     "--agents", bad, "--out", str(tmp_path / "x.jsonl"))
        assert_one_line_error(rc, err, f"--agents must be between 1 and 5, got {bad}")


def good_instance_line(tmp_path) -> str:
    out = tmp_path / "good.jsonl"
    r = run_cli("generate", "--config", "random", "--n", "2", "--seed", "0", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return out.read_text().splitlines()[0]


@pytest.mark.parametrize("what", ["config", "instances", "answers"])
def test_cli_non_utf8_file_is_one_line_error(tmp_path, what):
    out = tmp_path / "out.jsonl"
    bad = tmp_path / f"{what}.bin"
    if what == "config":
        bad.write_bytes(b'{"sizes": "\xff\xfe"}')
        r = run_cli("generate", "--config", str(bad), "--n", "3", "--seed", "0", "--out", str(out), cwd=tmp_path)
    else:
        line = good_instance_line(tmp_path).encode()
        inst = tmp_path / "inst.jsonl"
        ans = tmp_path / "ans.jsonl"
        if what == "instances":
            inst.write_bytes(line + b"\n" + line.replace(b'"g0-', b'"\xe9-') + b"\n")
            ans.write_text("")
            bad = inst
        else:
            inst.write_bytes(line + b"\n")
            iid = json.loads(line)["id"].encode()
            ans.write_bytes(b'{"id": "' + iid + b'", "text": "caf\xe9"}\n')
            bad = ans
        r = run_cli("verify", "--instances", str(inst), "--answers", str(ans), "--out", str(out), cwd=tmp_path)
    assert_one_line_error(r.returncode, r.stderr, str(bad), "UTF-8")
    if what != "config":
        assert f"{bad}:{2 if what == 'instances' else 1}:" in r.stderr  # names the line
    assert not out.exists() and no_tmp_files(tmp_path)


def test_cli_unexpected_error_is_one_line_and_leaves_no_output(tmp_path, capsys, monkeypatch):
    import env.__main__ as cli

    def boom(*a, **k):
        raise RuntimeError("solver exploded\nsecond line of detail")

    monkeypatch.setattr(cli, "generate", boom)
    out, stats = tmp_path / "i.jsonl", tmp_path / "s.json"
    rc, _, err = main_in_process(capsys, "generate", "--config", "random", "--n", "3", "--seed", "0",
                                 "--out", str(out), "--stats", str(stats))
    assert_one_line_error(rc, err, "RuntimeError: solver exploded")
    assert "second line" not in err
    assert not out.exists() and not stats.exists() and no_tmp_files(tmp_path)


def test_cli_generate_unwritable_stats_leaves_no_out(tmp_path, capsys, monkeypatch):
    out = tmp_path / "i.jsonl"
    args = ("generate", "--config", "random", "--n", "3", "--seed", "0", "--out", str(out))
    # 1. the stats folder cannot exist (a file is in the way): refused before generating.
    (tmp_path / "afile").write_text("x")
    rc, _, err = main_in_process(capsys, *args, "--stats", str(tmp_path / "afile" / "s.json"))
    assert_one_line_error(rc, err, "cannot write", "afile")
    assert not out.exists() and no_tmp_files(tmp_path)
    # 2. the stats path is a folder.
    (tmp_path / "adir").mkdir()
    rc, _, err = main_in_process(capsys, *args, "--stats", str(tmp_path / "adir"))
    assert_one_line_error(rc, err, "is a directory")
    assert not out.exists() and no_tmp_files(tmp_path)
    # 3. the last rename fails after --out is already in place: --out is taken back.
    import env.__main__ as cli

    real_replace = cli.os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("s.json"):
            raise PermissionError(13, "Permission denied", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(cli.os, "replace", failing_replace)
    stats = tmp_path / "s.json"
    rc, _, err = main_in_process(capsys, *args, "--stats", str(stats))
    assert_one_line_error(rc, err, f"cannot write {stats}", "Permission denied")
    assert not out.exists() and not stats.exists() and no_tmp_files(tmp_path)
    # 4. the same path for both is refused.
    monkeypatch.setattr(cli.os, "replace", real_replace)
    rc, _, err = main_in_process(capsys, *args, "--stats", str(out))
    assert_one_line_error(rc, err, "same file as --out")
    # And a writable pair writes both.
    rc, _, err = main_in_process(capsys, *args, "--stats", str(stats))
    assert rc == 0, err
    assert len(out.read_text().splitlines()) == 3 and json.loads(stats.read_text())["produced"] == 3


def mutate(line: str, **over) -> str:
    return json.dumps({**json.loads(line), **over})


BAD_INSTANCES = [
    # (change, words the error must contain)
    ({"starts": [[0, 0]] * 6, "goals": [[1, 1]] * 2}, "starts: 6 agents; an instance has 1..5 agents"),
    ({"goals": [[0, 0]]}, "goals: 1 goals for 2 starts"),
    ({"size": 5}, "grid: 3 rows, but size is 5"),
    ({"grid": ["FFF", "FF", "FFF"]}, "grid.1: row 'FF' has 2 cells, but size is 3"),
    ({"grid": ["FFF", "FXF", "FFF"]}, "grid.1: row 'FXF' has a cell other than"),
    ({"goals": [[0, 0], [3, 1]]}, "goals.1: (3, 1) is off the 3x3 map"),
    ({"starts": [[-1, 0], [0, 1]]}, "starts.0: (-1, 0) is off the 3x3 map"),
    ({"plan": [[[0, 0]]]}, "plan: 1 paths for 2 agents"),
    ({"plan": [[[0, 0]], [[0, 9]]]}, "plan.1.0: (0, 9) is off the 3x3 map"),
    ({"shortest": [1, 2, 3]}, "shortest: 3 distances for 2 agents"),
]


@pytest.mark.parametrize("change,needle", BAD_INSTANCES, ids=[n.split(":")[0] for _, n in BAD_INSTANCES])
def test_instance_rejects_malformed_shapes(change, needle):
    from env import Instance

    base = {"id": "x", "size": 3, "grid": ["FFF", "FHF", "FFF"], "starts": [[0, 0], [2, 0]], "goals": [[0, 2], [2, 2]],
            "plan": [], "optimal_cost": 4, "makespan": 2, "shortest": [2, 2], "needs_wait": False, "seed": 0}
    assert Instance.model_validate(base).num_agents == 2  # the base is fine; only the change breaks it
    with pytest.raises(ValidationError) as e:
        Instance.model_validate({**base, **change})
    assert needle in str(e.value)


@pytest.mark.parametrize("cmd", ["show", "verify"])
def test_cli_bad_instance_line_names_file_and_line(tmp_path, capsys, cmd):
    line = good_instance_line(tmp_path)
    inst = tmp_path / "inst.jsonl"
    # line 1 fine, line 2 blank, line 3 the audit's case: 6 starts, 2 goals on a map whose size is wrong.
    inst.write_text(line + "\n\n" + mutate(line, id="bad", starts=[[0, 0]] * 6, size=5) + "\n")
    out = tmp_path / "v.jsonl"
    if cmd == "show":
        rc, _, err = main_in_process(capsys, "show", "--instances", str(inst), "--id", "bad")
    else:
        (tmp_path / "a.jsonl").write_text("")
        rc, _, err = main_in_process(capsys, "verify", "--instances", str(inst), "--answers",
                                     str(tmp_path / "a.jsonl"), "--out", str(out))
    assert_one_line_error(rc, err, f"{inst}:3: not a valid instance", "starts: 6 agents")
    assert not out.exists()


def test_cli_verify_rejects_duplicate_ids(tmp_path, capsys):
    inst, ans, out = tmp_path / "i.jsonl", tmp_path / "a.jsonl", tmp_path / "v.jsonl"
    r = run_cli("generate", "--config", "random", "--n", "3", "--seed", "0", "--out", str(inst), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in inst.read_text().splitlines()]
    good = [{"id": x["id"], "text": plan_text([[tuple(c) for c in p] for p in x["plan"]])} for x in rows]
    args = ("verify", "--instances", str(inst), "--answers", str(ans), "--out", str(out))
    # The same answer id twice (even with a different text) would be scored twice: refused.
    ans.write_text("\n".join(json.dumps(a) for a in [*good, {**good[1], "text": "no idea"}]) + "\n")
    rc, _, err = main_in_process(capsys, *args)
    assert_one_line_error(rc, err, f"{ans}:4: duplicate answer id {rows[1]['id']!r} (first on line 2)")
    assert not out.exists()
    # Two instances with the same id: the later one would silently replace the earlier.
    ans.write_text("\n".join(json.dumps(a) for a in good) + "\n")
    dup = tmp_path / "dup.jsonl"
    dup.write_text(inst.read_text() + json.dumps({**rows[0], "seed": 99}) + "\n")
    rc, _, err = main_in_process(capsys, "verify", "--instances", str(dup), "--answers", str(ans), "--out", str(out))
    assert_one_line_error(rc, err, f"{dup}:4: duplicate instance id {rows[0]['id']!r} (first on line 1)")
    assert not out.exists()
    # Unique ids verify fine.
    rc, _, err = main_in_process(capsys, *args)
    assert rc == 0, err


def test_cli_benchmark_list_shows_count_sizes_and_checksum(capsys):
    rc, out, _ = main_in_process(capsys, "benchmark", "--list")
    assert rc == 0
    sums = dict(reversed(line.split()) for line in (DATA_DIR / "checksums.sha256").read_text().splitlines())
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == set(list_splits())
    for name, line in lines.items():
        insts = load_split(name)
        sizes = sorted({i.size for i in insts})
        assert f" {len(insts)} instances" in line, line
        assert f"sizes {sizes[0]}..{sizes[-1]}" in line, line
        assert f"sha256 {sums[f'{name}.jsonl'][:12]}" in line, line
    assert "agents 3..5" in lines["test"] and "agents 2" in lines["val"]


def test_cli_verify_says_reward_is_r_acc(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main_in_process(capsys, "verify", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "`reward` is R_acc, the accuracy part of the reward" in help_text
    assert "not the length-weighted total" in help_text
