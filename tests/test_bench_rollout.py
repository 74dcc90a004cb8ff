"""bench_rollout: each path's greedy tokens are compared with the first path of its dtype, on the real embedded model."""

from __future__ import annotations

import pytest

import evals.bench.bench_rollout as br


def test_greedy_float32_copy_is_compared_with_the_float32_model_and_equals_it(embedded_model_path, capsys):
    out = br.main(["--model", str(embedded_model_path), "--paths", "fp32,rollout-fp32,bf16,rollout,rollout-fp32-packed",
                   "--rows", "2",
                   "--groups", "1", "--new-tokens", "6", "--repeats", "1", "--greedy"])
    same = out["same_greedy_tokens"]
    assert set(same) == {"rollout-fp32", "rollout", "rollout-fp32-packed"}
    assert same["rollout-fp32"] == {"as": "fp32", "equal": True}  # the float32 copy answers as transformers does
    assert same["rollout"]["as"] == "bf16"
    assert same["rollout-fp32-packed"]["as"] == "fp32"  # the packed copy is a float32 path too
    assert set(out["paths"]) == {"fp32", "rollout-fp32", "bf16", "rollout", "rollout-fp32-packed"}
    assert "rollout-fp32 to fp32 True" in capsys.readouterr().out


def test_bad_path_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        br.main(["--paths", "fp32,fp16"])
    assert e.value.code == 2 and "--paths 'fp32,fp16': allowed:" in capsys.readouterr().err
