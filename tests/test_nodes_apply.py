"""apply: stage 0 from the random config (or a given one), later stages from the accepted config, with
the history appended and the data reproducible from (seed, stage)."""

from __future__ import annotations

import json

from env import EnvConfig, random_config, read_jsonl, uniform_config
from nodes.apply import apply, stage_seed
from tests.support.node_helpers import make_settings, runtime


def test_first_apply_builds_stage0_from_the_random_config(tmp_path):
    settings = make_settings(seed=5)
    out = apply({}, runtime(settings, tmp_path))
    sdir = tmp_path / "stage_0"
    assert out["stage"] == 0 and out["train_path"] == str(sdir / "train.jsonl") and out["history"] == []
    cfg = EnvConfig.model_validate(out["config"])
    assert cfg.sizes == random_config(5).sizes and cfg.num_instances == 12
    assert json.loads((sdir / "config.json").read_text()) == out["config"]
    instances = read_jsonl(sdir / "train.jsonl")
    stats = json.loads((sdir / "env_stats.json").read_text())
    assert len(instances) == stats["produced"] == stats["generated"] == 12
    assert stats["seed"] == stage_seed(5, 0) and set(stats["sizes"]) == {str(s) for s in range(3, 11)}
    assert all(inst.num_agents == 2 for inst in instances)


def test_first_apply_uses_a_given_initial_config(tmp_path):
    given = uniform_config(0.1, 0.0).model_dump(mode="json")
    out = apply({"config": given, "stage": 0}, runtime(make_settings(), tmp_path))
    assert EnvConfig.model_validate(out["config"]).sizes == uniform_config(0.1, 0.0).sizes
    assert all(not i.needs_wait for i in read_jsonl(out["train_path"]))  # wait_ratio 0 everywhere


def test_next_apply_uses_accepted_and_appends_history(tmp_path):
    settings = make_settings(seed=5)
    state = dict(apply({}, runtime(settings, tmp_path)))
    state.update(
        metrics={"eval/valid_rate": 0.25, "by_size": {}},
        rationale="more 4x4",
        decision="projected",
        accepted=uniform_config(0.3).model_dump(mode="json"),
    )
    out = apply(state, runtime(settings, tmp_path))
    assert out["stage"] == 1 and out["train_path"].endswith("stage_1/train.jsonl")
    assert EnvConfig.model_validate(out["config"]).sizes == uniform_config(0.3).sizes
    (entry,) = out["history"]
    assert entry["stage"] == 0 and entry["config"] == state["config"] and entry["metrics"]["eval/valid_rate"] == 0.25
    assert entry["rationale"] == "more 4x4" and entry["decision"] == "projected"
    assert out["attempts"] == 0 and out["feedback"] == [] and out["proposal"] is None
    stats = json.loads((tmp_path / "stage_1" / "env_stats.json").read_text())
    assert stats["seed"] == stage_seed(5, 1) != stage_seed(5, 0)


def test_same_seed_same_bytes_and_resume_reuses(tmp_path):
    settings = make_settings(seed=9)
    a = apply({}, runtime(settings, tmp_path / "a"))
    b = apply({}, runtime(settings, tmp_path / "b"))
    pa, pb = (tmp_path / "a" / "stage_0" / "train.jsonl"), (tmp_path / "b" / "stage_0" / "train.jsonl")
    assert pa.read_bytes() == pb.read_bytes() and a["config"] == b["config"]
    before = pa.stat().st_mtime_ns
    apply({}, runtime(settings, tmp_path / "a"))  # a resumed run finds the finished stage folder
    assert pa.stat().st_mtime_ns == before


def test_generation_prints_a_progress_line_before_and_after(tmp_path, capsys):
    settings = make_settings(seed=3)
    apply({}, runtime(settings, tmp_path))
    err = capsys.readouterr().err
    assert "apply: generating 12 training instances for stage_0" in err
    assert "apply: generated 12 of 12 instances for stage_0 in " in err and " s\n" in err
    apply({}, runtime(settings, tmp_path))  # a finished stage folder is reused: nothing generated, no line
    assert "generating" not in capsys.readouterr().err
