"""Classic engineers: each moves the config in the direction its rule says, on synthetic success rates."""

from __future__ import annotations

import random

import pytest

from env import SIZES, EnvConfig, random_config, uniform_config
from families.mapf_curricula import CLASSIC, fixed, learnability, random_engineer, sizes_of, threshold


def _by_level(p: dict[int, float], n: int = 20) -> dict[str, dict]:
    return {str(s): {"n": n, "valid_rate": v, "optimal_rate": v / 2} for s, v in p.items()}


def _cfg() -> dict:
    return uniform_config(hole_ratio=0.2, wait_ratio=0.5).model_dump(mode="json")


def test_learnability_moves_data_to_p_near_half_and_nudges_difficulty():
    cfg = _cfg()
    p = {3: 1.0, 4: 0.5, 5: 0.0, 6: 0.3}
    raw, why, _ = learnability(cfg, _by_level(p), {}, random.Random(0))
    new = sizes_of(raw)
    EnvConfig.model_validate(raw)  # a classic engineer's answer is strictly valid
    assert new[4]["data_ratio"] > new[6]["data_ratio"] > new[3]["data_ratio"]  # p(1-p): .25 > .21 > 0
    assert new[3]["data_ratio"] == pytest.approx(new[5]["data_ratio"])  # p=1 and p=0: both the floor
    assert new[3]["data_ratio"] > 0  # the uniform share keeps every size alive
    assert new[3]["hole_ratio"] > 0.2 and new[3]["wait_ratio"] > 0.5  # too easy -> harder
    assert new[5]["hole_ratio"] < 0.2 and new[5]["wait_ratio"] < 0.5  # too hard -> easier
    assert new[4]["hole_ratio"] == pytest.approx(0.2)  # at the target: unchanged
    assert new[9]["hole_ratio"] == pytest.approx(0.2)  # not evaluated: difficulty unchanged
    assert "learnability" in why


def test_learnability_without_signal_spreads_uniformly():
    raw, _, _ = learnability(_cfg(), _by_level({3: 1.0, 4: 0.0}), {}, random.Random(0))
    assert {round(k["data_ratio"], 6) for k in sizes_of(raw).values()} == {0.125}


def test_threshold_raises_difficulty_of_sizes_past_the_bar():
    cfg = _cfg()
    raw, why, mem = threshold(cfg, _by_level({3: 0.9, 4: 0.2}), {}, random.Random(0))
    new, old = sizes_of(raw), sizes_of(cfg)
    EnvConfig.model_validate(raw)
    assert new[3]["hole_ratio"] > old[3]["hole_ratio"] and new[3]["wait_ratio"] > old[3]["wait_ratio"]
    assert new[3]["data_ratio"] < old[3]["data_ratio"] < new[4]["data_ratio"]  # data moves up a size
    assert new[4]["hole_ratio"] == old[4]["hole_ratio"] and new[4]["wait_ratio"] == old[4]["wait_ratio"]
    assert mem["levels"] == {"3": 1}
    raw2, _, mem2 = threshold(raw, _by_level({3: 0.95}), mem, random.Random(0))
    assert sizes_of(raw2)[3]["hole_ratio"] > new[3]["hole_ratio"] and mem2["levels"] == {"3": 2}
    _, why_none, _ = threshold(cfg, _by_level({3: 0.1}), {}, random.Random(0))
    assert "unchanged" in why_none


def test_fixed_keeps_the_stage0_config_forever():
    stage0 = random_config(3).model_dump(mode="json")
    raw0, _, mem = fixed(stage0, {}, {}, random.Random(0))
    other = random_config(4).model_dump(mode="json")
    raw1, _, _ = fixed(other, _by_level({3: 0.5}), mem, random.Random(1))
    assert raw1 == raw0
    assert EnvConfig.model_validate(raw1).sizes == EnvConfig.model_validate(stage0).sizes


def test_random_draws_a_fresh_valid_config_per_rng():
    a, _, _ = random_engineer(_cfg(), {}, {}, random.Random("7:1"))
    b, _, _ = random_engineer(_cfg(), {}, {}, random.Random("7:2"))
    a2, _, _ = random_engineer(_cfg(), {}, {}, random.Random("7:1"))
    assert a == a2 and a != b
    EnvConfig.model_validate(a)


@pytest.mark.parametrize("name", sorted(CLASSIC))
def test_every_classic_engineer_answers_all_sizes(name):
    raw, why, mem = CLASSIC[name](_cfg(), _by_level({3: 0.6, 5: 0.1}), {}, random.Random(0))
    assert set(raw) == {"sizes"} and set(map(int, raw["sizes"])) == set(SIZES)
    assert isinstance(why, str) and why and isinstance(mem, dict)


@pytest.mark.parametrize("name", sorted(CLASSIC))
def test_classic_answers_pass_strict_validation_as_written(name):
    """Shares like 1/21 (a stage-0 config masked to sizes 3-5 and renormalised) rounded to 6 decimals must
    still sum to 1: the answer is accepted as written, never projected for a rounding error."""
    for seed in range(30):
        stage0 = random_config(seed).model_dump(mode="json")
        rng = random.Random(seed)
        shares = [rng.random() for _ in SIZES]
        for s, x in zip(SIZES, shares, strict=True):
            stage0["sizes"][str(s)]["data_ratio"] = x / sum(shares)
        raw, _, _ = CLASSIC[name](stage0, _by_level({3: 0.6, 4: 0.3, 5: 0.1}), {}, random.Random(seed))
        EnvConfig.model_validate(raw)  # raises when the rounded shares miss 1 by more than 1e-6
