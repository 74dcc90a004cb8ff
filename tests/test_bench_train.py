"""bench_train --dtypes and --share-prompt: each lever is its own arm of the cpu preset's GRPO step, interleaved, median kept."""

from __future__ import annotations

import evals.bench.bench_train as bt


def test_dtype_arms_run_each_lever_interleaved_and_report_medians(monkeypatch, capsys):
    calls, packs = [], []
    fake_seconds = {"fp32": [60.0, 50.0, 58.0], "fp32_copy": [47.0, 46.0, 44.0], "fp32_copy_packed": [40.0, 39.0, 42.0],
                    "bf16_copy": [45.0, 52.0, 48.0], "bf16_copy_autocast": [40.0, 38.0, 41.0]}

    def fake_child(side, raw, a, sft_steps=None, extra_env=None):
        name = side.split(" round ")[0]
        calls.append((name, raw["rollout_dtype"], raw["autocast_bf16"], raw["resample_rounds"], sft_steps))
        packs.append((name, raw.get("rollout_prepack")))
        return {"grpo_seconds_per_step": fake_seconds[name][int(side.rsplit(" ", 1)[1]) - 1]}

    monkeypatch.setattr(bt, "_child", fake_child)
    out = bt.main(["--dtypes", "--rounds", "3", "--grpo-steps", "1"])
    # interleaved: every arm once per round, GRPO only, dynamic sampling off (the same work per step)
    assert [c[0] for c in calls] == ["fp32", "fp32_copy", "fp32_copy_packed", "bf16_copy", "bf16_copy_autocast"] * 3
    assert {c[1:] for c in calls if c[0] == "fp32"} == {("model", False, 0, 0)}
    assert {c[1:] for c in calls if c[0] in ("fp32_copy", "fp32_copy_packed")} == {("float32", False, 0, 0)}
    assert {c[1:] for c in calls if c[0] == "bf16_copy_autocast"} == {("bfloat16", True, 0, 0)}
    # the two float32 copies differ only in packing; the bf16 copies are not packed
    assert set(packs) == {("fp32", None), ("fp32_copy", False), ("fp32_copy_packed", True), ("bf16_copy", False),
                          ("bf16_copy_autocast", False)}
    assert out["median"] == {"fp32": 58.0, "fp32_copy": 46.0, "fp32_copy_packed": 40.0, "bf16_copy": 48.0,
                             "bf16_copy_autocast": 40.0}
    assert abs(out["speedup_over_fp32"]["bf16_copy_autocast"] - 58.0 / 40.0) < 1e-9
    assert "1.45x fp32" in capsys.readouterr().out


def test_dtype_arms_picks_some_arms_the_first_the_base(monkeypatch, capsys):
    calls = []

    def fake_child(side, raw, a, sft_steps=None, extra_env=None):
        calls.append(side)
        return {"grpo_seconds_per_step": {"fp32": 60.0, "fp32_copy": 48.0}[side.split(" round ")[0]]}

    monkeypatch.setattr(bt, "_child", fake_child)
    out = bt.main(["--dtypes", "--arms", "fp32_copy,fp32", "--rounds", "1", "--grpo-steps", "1"])
    assert calls == ["fp32_copy round 1", "fp32 round 1"]
    assert out["speedup_over_fp32_copy"] == {"fp32_copy": 1.0, "fp32": 0.8}
    assert "0.80x fp32_copy" in capsys.readouterr().out


def test_share_prompt_arms_toggle_only_the_shared_prompt(monkeypatch, capsys):
    calls = []

    def fake_child(side, raw, a, sft_steps=None, extra_env=None):
        calls.append((side, raw["share_prompt"], raw["resample_rounds"], raw.get("rollout_dtype", "auto")))
        return {"grpo_seconds_per_step": 30.0 if raw["share_prompt"] else 45.0}

    monkeypatch.setattr(bt, "_child", fake_child)
    out = bt.main(["--share-prompt", "--rounds", "2", "--grpo-steps", "1"])
    assert [c[:2] for c in calls] == [("per_row_prompt round 1", False), ("shared_prompt round 1", True),
                                      ("per_row_prompt round 2", False), ("shared_prompt round 2", True)]
    assert {c[2:] for c in calls} == {(0, "auto")}  # dynamic sampling off; the preset's dtypes in both arms
    assert out["speedup_over_per_row_prompt"]["shared_prompt"] == 1.5
    assert "1.50x per_row_prompt" in capsys.readouterr().out


def test_head_tiles_arms_differ_only_in_the_childs_environment(monkeypatch, capsys):
    calls = []

    def fake_child(side, raw, a, sft_steps=None, extra_env=None):
        calls.append((side, dict(extra_env or {}), raw["resample_rounds"], raw.get("rollout_dtype", "auto")))
        return {"grpo_seconds_per_step": 40.0 if not extra_env else 44.0}

    monkeypatch.setattr(bt, "_child", fake_child)
    out = bt.main(["--head-tiles", "--rounds", "1", "--grpo-steps", "1"])
    assert calls == [("trl_tiles round 1", {"ENV_ENGINEER_HEAD_TILES": "0"}, 0, "auto"),
                     ("cpu_tiles round 1", {}, 0, "auto")]
    assert out["speedup_over_trl_tiles"]["cpu_tiles"] == 1.1
    assert "1.10x trl_tiles" in capsys.readouterr().out


def test_bad_flags_get_one_clear_error(capsys):
    import pytest

    for argv, said in ((["--dtypes", "--rounds", "0"], "--rounds 0: allowed: 1 or more"),
                       (["--dtypes", "--compare"], "not allowed with argument"),
                       (["--dtypes", "--share-prompt"], "not allowed with argument"),
                       (["--dtypes", "--arms", "fp32,fp16"], "--arms 'fp32,fp16': allowed: a comma list among fp32, "
                        "fp32_copy"),
                       (["--arms", "fp32"], "--arms 'fp32': goes with --dtypes")):
        with pytest.raises(SystemExit) as e:
            bt.main(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err
