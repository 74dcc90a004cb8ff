"""apply: stage 0 from the random config (or a given one), later stages from the accepted config, with
the history appended and the data reproducible from (seed, stage)."""

from __future__ import annotations

import json

import pytest

from env import EnvConfig, random_config, read_jsonl, restrict_sizes, uniform_config
from nodes.apply import apply, stage_seed
from tests.support.node_helpers import make_settings, runtime


def test_first_apply_builds_stage0_from_the_random_config(tmp_path):
    settings = make_settings(seed=5, train={"max_train_size": None})
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
    out = apply({"config": given, "stage": 0}, runtime(make_settings(train={"max_train_size": None}), tmp_path))
    assert EnvConfig.model_validate(out["config"]).sizes == uniform_config(0.1, 0.0).sizes
    assert all(not i.needs_wait for i in read_jsonl(out["train_path"]))  # wait_ratio 0 everywhere


def test_next_apply_uses_accepted_and_appends_history(tmp_path):
    settings = make_settings(seed=5, train={"max_train_size": None})
    state = dict(apply({}, runtime(settings, tmp_path)))
    state.update(
        metrics={"eval/valid_rate": 0.25, "by_level": {}},
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


def test_restrict_sizes_moves_the_data_above_the_cap_onto_the_smaller_sizes():
    cfg = random_config(0)
    capped, note = restrict_sizes(cfg, 5)
    share = {s: k.data_ratio for s, k in cfg.sizes.items()}
    left = share[3] + share[4] + share[5]
    assert [capped.sizes[s].data_ratio for s in range(6, 11)] == [0.0] * 5
    assert capped.sizes[3].data_ratio == pytest.approx(share[3] / left) and left < 0.99
    assert all(capped.sizes[s].hole_ratio == cfg.sizes[s].hole_ratio for s in range(3, 11))
    assert note.startswith("sizes 6-10 are not trained at this preset (max_train_size 5): their data share ")
    assert f"{100 * (1 - left):.0f} % moved onto 3-5" in note
    # nothing to move, or no cap: the same config and no note
    assert restrict_sizes(capped, 5) == (capped, None) and restrict_sizes(cfg, None) == (cfg, None)
    # everything above the cap: spread evenly over 3..cap
    only_big = {s: {"data_ratio": 1.0 if s == 9 else 0.0, "hole_ratio": 0.1, "wait_ratio": 0.0} for s in range(3, 11)}
    spread, note = restrict_sizes(EnvConfig.model_validate({"sizes": only_big}), 4)
    assert [spread.sizes[s].data_ratio for s in (3, 4, 5)] == [0.5, 0.5, 0.0] and "spread evenly over 3-4" in note
    assert restrict_sizes(cfg, 9)[1].startswith("size 10 is not trained at this preset (max_train_size 9)")
    assert restrict_sizes(cfg, 3)[1].endswith("moved onto 3")
    with pytest.raises(ValueError, match="max_train_size must be one of 3..10 or None; got 2"):
        restrict_sizes(cfg, 2)
    with pytest.raises(ValueError, match="max_train_size must be one of 3..10 or None; got 11"):
        restrict_sizes(cfg, 11)
    assert restrict_sizes(cfg, 10) == (cfg, None)


def test_apply_trains_only_up_to_max_train_size_and_says_so(tmp_path, capsys):
    settings = make_settings(seed=5, train={"instances_per_stage": 40, "max_train_size": 4})
    out = apply({}, runtime(settings, tmp_path))
    cfg = EnvConfig.model_validate(out["config"])  # config.json holds what was trained, valid as a config
    assert cfg == restrict_sizes(random_config(5).model_copy(update={"num_instances": 40}), 4)[0]
    assert json.loads((tmp_path / "stage_0" / "config.json").read_text()) == out["config"]
    sizes = [i.size for i in read_jsonl(out["train_path"])]
    assert len(sizes) == 40 and set(sizes) == {3, 4}
    assert "max_train_size 4" in out["log"][-1] and "apply: stage 0: sizes 5-10 are not trained" in capsys.readouterr().err
    # a later stage restricts the accepted config the same way
    state = dict(out, accepted=uniform_config().model_dump(mode="json"), metrics={}, rationale="", decision="kept")
    later = apply(state, runtime(settings, tmp_path))
    assert {i.size for i in read_jsonl(later["train_path"])} == {3, 4}


def test_the_report_says_which_sizes_were_trained(tmp_path):
    from nodes.report import collect, render

    for top, said in ((5, True), (None, False)):
        (tmp_path / "settings.json").write_text(json.dumps({"train": {"max_train_size": top}}))
        text = render(collect(tmp_path), [], "run")
        line = "Only sizes 3x3-5x5 were trained (`train.max_train_size` 5): each table is the configuration trained"
        assert (line in text) is said
