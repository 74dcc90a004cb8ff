"""What makes the 135M policy learn at CPU scale: the compact prompt, the cached SFT warm start,
TRL's fused head scoring only answer positions, and dynamic sampling of GRPO groups.

The slow tests build real warm starts of the embedded SmolLM2-135M (a few SFT steps each) in a private cache.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from env import load_split, parse_plan, plan_text, render_compact_prompt, render_prompt
from env.library import prompt_messages
from trainer.config import TRAIN_PRESETS, TrainConfig

# ----------------------------------------------------------------------------------------------------
# the compact prompt


def _read_back(prompt: str) -> dict:
    """Everything the verifier needs, read back from a compact prompt alone."""
    m = re.match(r"Map (\d+)x\1, \(row,col\) from \(0,0\), H = hole:\n", prompt)
    assert m, prompt[:80]
    n = int(m.group(1))
    rows = prompt[m.end():].split("\n")[:n]
    holes_line = re.search(r"^Holes: (.*)$", prompt, re.M).group(1)
    holes = [] if holes_line == "none" else [tuple(map(int, c)) for c in re.findall(r"\((\d+),(\d+)\)", holes_line)]
    agents = re.findall(r"^Agent (\d+): \((\d+),(\d+)\) -> \((\d+),(\d+)\)$", prompt, re.M)
    return {
        "size": n,
        "rows": rows,
        "holes": holes,
        "starts": [(int(a[1]), int(a[2])) for a in agents],
        "goals": [(int(a[3]), int(a[4])) for a in agents],
    }


@pytest.mark.parametrize("split", ["val", "test-mini"])
def test_compact_prompt_carries_the_instance_and_takes_the_solver_plan(split):
    for inst in load_split(split):
        prompt = render_compact_prompt(inst)
        back = _read_back(prompt)
        assert back["size"] == inst.size
        assert back["rows"] == ["".join("H" if ch == "H" else "." for ch in row) for row in inst.grid]
        assert back["holes"] == [(r, c) for r, row in enumerate(inst.grid) for c, ch in enumerate(row) if ch == "H"]
        assert back["starts"] == [tuple(s) for s in inst.starts] and back["goals"] == [tuple(g) for g in inst.goals]
        # the answer format the prompt shows is the one env.parse_plan reads: the solver's plan parses back
        plan = parse_plan(prompt.split("<answer>")[0] + plan_text(inst.plan), inst.num_agents)
        assert plan == [[tuple(c) for c in path] for path in inst.plan]
        assert "<answer>" in prompt and "</answer>" in prompt
        assert len(prompt) < len(render_prompt(inst)) * 0.6


@pytest.mark.parametrize("split", ["val", "test-mini"])
def test_moves_prompt_lists_exactly_the_legal_moves_and_keeps_the_compact_prompt(split):
    """Each ice cell's line holds exactly the cells the verifier accepts as one move from it; the rest of the prompt
    is the compact one, so the solver's plan still parses back."""
    from env.prompt import render_moves_prompt
    from env.verify import path_sound

    for inst in load_split(split):
        prompt = render_moves_prompt(inst)
        lines = re.findall(r"^\((\d+),(\d+)\): (.*)$", prompt, re.M)
        listed = {(int(r), int(c)): ([] if rest == "none" else
                                     [tuple(map(int, x)) for x in re.findall(r"\((\d+),(\d+)\)", rest)])
                  for r, c, rest in lines}
        ice = {(r, c) for r, row in enumerate(inst.grid) for c, ch in enumerate(row) if ch != "H"}
        assert set(listed) == ice
        every = [(r, c) for r in range(inst.size) for c in range(inst.size)]
        for cell, nxt in listed.items():
            # the verifier's own test of a path: listed iff one step from `cell` to `other` is sound (no wait)
            sound = [o for o in every if o != cell and path_sound([cell, o], cell, inst.size, inst.grid)]
            assert sorted(nxt) == sorted(sound), (inst.id, cell)
        compact_lines = render_compact_prompt(inst).split("\n")
        assert [x for x in prompt.split("\n") if not re.match(r"^\(\d+,\d+\): ", x) and x != "Moves from each ice cell:"] \
            == compact_lines
        plan = parse_plan(prompt.split("<answer>")[0] + plan_text(inst.plan), inst.num_agents)
        assert plan == [[tuple(c) for c in path] for path in inst.plan]
        assert prompt_messages(inst, "moves") == [{"role": "system", "content": ""}, {"role": "user", "content": prompt}]


def test_prompt_style_is_a_setting_full_for_paper_compact_for_cpu():
    assert TrainConfig.model_validate(TRAIN_PRESETS["paper"]).prompt_style == "full"
    assert TrainConfig.model_validate(TRAIN_PRESETS["cpu"]).prompt_style == "compact"
    inst = load_split("val-mini")[0]
    full = prompt_messages(inst, "full")
    assert full == [{"role": "user", "content": render_prompt(inst)}]
    assert "Rules:" in full[0]["content"]  # the paper preset renders the whole rules text
    compact = prompt_messages(inst, "compact")
    assert compact[0] == {"role": "system", "content": ""} and compact[1]["content"] == render_compact_prompt(inst)
    with pytest.raises(ValueError, match="prompt style 'tiny': allowed: full, compact, moves"):
        render_prompt(inst, "tiny")
    with pytest.raises(ValueError, match="prompt_style"):
        TrainConfig(prompt_style="tiny")


def test_compact_prompt_drops_the_default_system_prompt(embedded_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_model_path)
    inst = [i for i in load_split("val") if i.size == 3][0]
    full = tok.apply_chat_template(prompt_messages(inst, "full"), add_generation_prompt=True, tokenize=False)
    compact = tok.apply_chat_template(prompt_messages(inst, "compact"), add_generation_prompt=True, tokenize=False)
    assert "SmolLM" in full and "SmolLM" not in compact
    assert len(tok(compact)["input_ids"]) * 2 < len(tok(full)["input_ids"])


def test_val_small_split_is_150_two_agent_instances_of_sizes_3_to_5():
    insts = load_split("val-small")
    assert len(insts) == 150
    assert {(i.size, i.num_agents) for i in insts} == {(3, 2), (4, 2), (5, 2)}
    assert all(sum(i.size == s for i in insts) == 50 for s in (3, 4, 5))
    assert not {i.id for i in insts} & {i.id for i in load_split("val")}


# ----------------------------------------------------------------------------------------------------
# TRL's fused head on CPU: only labelled positions, same values


def test_fused_head_scores_only_labelled_positions_with_the_same_values(embedded_model_path, monkeypatch):
    import torch
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from trainer import trl_cpu

    # start from TRL as shipped, whatever earlier tests patched (monkeypatch puts it back afterwards)
    monkeypatch.setattr(trl_utils, "_use_triton", getattr(trl_utils._use_triton, "original", trl_utils._use_triton))
    monkeypatch.setattr(trl_cpu, "_PATCHED", False)
    model = AutoModelForCausalLM.from_pretrained(embedded_model_path, dtype=torch.float32)
    add_fused_lm_head(model)
    ids = torch.randint(0, 1000, (2, 40))
    labels = ids.clone()
    labels[:, :30] = -100  # a prompt of 30 tokens, an answer of 10

    seen = []
    real = trl_utils._ChunkedLogProbFunction

    class Spy:  # counts the rows TRL sends through its chunked head
        @staticmethod
        def apply(hidden, *args):
            seen.append(hidden.shape[0])
            return real.apply(hidden, *args)

    trl_utils._ChunkedLogProbFunction = Spy
    try:
        with torch.no_grad():
            before = model(input_ids=ids, labels=labels, fused_lm_head=True)
            trl_cpu.score_labelled_positions_only()
            assert trl_utils._use_triton(torch.device("cpu")) is True
            after = model(input_ids=ids, labels=labels, fused_lm_head=True)
    finally:
        trl_utils._ChunkedLogProbFunction = real
    assert seen == [2 * 39, 2 * 10]  # every shifted position before, the 10 labelled ones of each row after
    assert torch.allclose(before.log_probs, after.log_probs, atol=1e-5)
    assert torch.allclose(before.loss, after.loss, atol=1e-6)
    assert trl_cpu.score_labelled_positions_only() is False  # idempotent


def test_tiled_head_gives_trls_values_in_cpu_sized_tiles(monkeypatch):
    """`_CpuTiledHead`: rows in blocks of CPU_HEAD_ROWS, each with CPU_HEAD_VOCAB columns per tile; the log-probs,
    entropies and hidden-state gradients are TRL's own up to rounding. Off CPU (a meta tensor) TRL gets the call as
    it was. `tile_head_on_cpu` patches once, and not at all with ENV_ENGINEER_TRL_PATCH=0."""
    import torch
    import trl.trainer.utils as trl_utils
    from trl.kernels import ChunkedLogProbFunction

    from trainer import trl_cpu

    calls = []

    class Spy:
        @staticmethod
        def apply(hidden, weight, bias, targets, temperature, chunk_size, *rest):
            calls.append((hidden.shape[0], chunk_size))
            if hidden.device.type == "meta":
                return (hidden.new_empty(hidden.shape[0]),) + (None,) * 4
            return ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk_size, *rest)

    torch.manual_seed(0)
    rows, vocab = trl_cpu.CPU_HEAD_ROWS * 2 + 76, trl_cpu.CPU_HEAD_VOCAB * 2 + 904
    weight = torch.randn(vocab, 64)
    hidden, targets, adv = torch.randn(rows, 64), torch.randint(0, vocab, (rows,)), torch.randn(rows)

    def score(fn):  # a trained head too (train_layers=0): its gradient sums over the row blocks
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        logps, entropy, *_ = fn.apply(h, w, None, targets, 0.7, 32768, None, 1.0, ("entropy",))
        (logps * adv).sum().backward()
        return logps.detach(), entropy.detach(), h.grad, w.grad

    ref = score(ChunkedLogProbFunction)
    tiled = score(trl_cpu._CpuTiledHead(Spy))
    assert calls == [(trl_cpu.CPU_HEAD_ROWS, trl_cpu.CPU_HEAD_VOCAB)] * 2 + [(76, trl_cpu.CPU_HEAD_VOCAB)]
    for x, y in zip(ref, tiled, strict=True):
        assert x.shape == y.shape and torch.allclose(x, y, atol=1e-4)
    calls.clear()
    trl_cpu._CpuTiledHead(Spy).apply(torch.empty(rows, 64, device="meta"), weight, None, targets, 0.7, 32768)
    assert calls == [(rows, 32768)]  # not on CPU: TRL's own tiles

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", ChunkedLogProbFunction)
    monkeypatch.setattr(trl_cpu, "_TILED", False)
    monkeypatch.setenv("ENV_ENGINEER_TRL_PATCH", "0")
    assert trl_cpu.tile_head_on_cpu() is False and trl_utils._ChunkedLogProbFunction is ChunkedLogProbFunction
    monkeypatch.delenv("ENV_ENGINEER_TRL_PATCH")
    monkeypatch.setenv("ENV_ENGINEER_HEAD_TILES", "0")  # TRL's tiles alone (bench_train --head-tiles)
    assert trl_cpu.tile_head_on_cpu() is False and trl_utils._ChunkedLogProbFunction is ChunkedLogProbFunction
    monkeypatch.delenv("ENV_ENGINEER_HEAD_TILES")
    assert trl_cpu.tile_head_on_cpu() is True
    assert isinstance(trl_utils._ChunkedLogProbFunction, trl_cpu._CpuTiledHead)
    assert trl_cpu.tile_head_on_cpu() is False  # idempotent: never a wrapper of a wrapper
    assert trl_utils._ChunkedLogProbFunction.original is ChunkedLogProbFunction


def test_bench_head_times_both_sides_on_the_embedded_head(capsys):
    from evals.bench.bench_head import main

    out = main(["--rows", "600", "--repeats", "1"])
    assert set(out["median"]) == {"trl", "tiled"} and all(v > 0 for v in out["median"].values())
    assert out["vocab"] == 49152 and out["tiles"]["tiled"][0] < out["tiles"]["trl"][0]
    assert max(out["max_abs_diff"].values()) < 1e-3
    assert "forward + backward, median" in capsys.readouterr().out


@pytest.mark.slow
def test_a_stage_without_vllm_imports_trls_grpo_trainer_without_it_and_a_vllm_stage_gets_it_back():
    """In a fresh process, as a stage child: the GRPO trainer class for a transformers stage leaves vLLM unimported
    and TRL's own check truthful afterwards; asking again with use_vllm imports TRL's vLLM names after all."""
    import subprocess
    import sys

    script = """
import sys
from trainer.trl_cpu import grpo_trainer_class
import trl.import_utils as trl_imports
real = trl_imports.is_vllm_available
cls = grpo_trainer_class(use_vllm=False)
assert cls.__name__ == "GRPOTrainer" and "vllm" not in sys.modules, sorted(m for m in sys.modules if "vllm" in m)[:5]
import trl.generation.vllm_client as client, trl.generation.vllm_generation as generation
assert not hasattr(generation, "LLM")  # imported as if vLLM were absent
assert trl_imports.is_vllm_available is real and client.is_vllm_available is real and generation.is_vllm_available is real
assert grpo_trainer_class(use_vllm=True) is cls
assert "vllm" in sys.modules and generation.LLM.__module__.startswith("vllm"), generation.LLM
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.slow
def test_bench_trainer_import_times_trl_as_shipped_and_without_vllm(capsys):
    from evals.bench.bench_trainer_import import main

    out = main(["--repeats", "1"])
    assert out["sides"]["shipped"]["vllm_imported"] is True and out["sides"]["no_vllm"]["vllm_imported"] is False
    assert all(side["import_s"] > 0 for side in out["sides"].values())
    assert "saved per stage child" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------
# dynamic sampling


def test_replace_groups_repads_and_recounts():
    import torch

    from trainer.grpo_trainer import replace_groups, zero_variance_groups

    g = 2
    batch = {
        "prompt_ids": torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[1, 2], [1, 0], [3, 3], [3, 0]]),
        "completion_mask": torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]]),
        "advantages": torch.tensor([0.0, 0.0, 1.0, -1.0]),
        "num_items_in_batch": torch.tensor(6),
    }
    assert zero_variance_groups(batch["advantages"], g) == [0]
    fresh = {
        "prompt_ids": torch.tensor([[4, 4], [4, 4], [2, 2], [2, 2]]),
        "prompt_mask": torch.ones(4, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[9, 9, 9, 9], [9, 9, 9, 0], [8, 0, 0, 0], [8, 0, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0]]),
        "advantages": torch.tensor([0.5, -0.5, 0.0, 0.0]),
        "num_items_in_batch": torch.tensor(9),
    }
    out = replace_groups(batch, fresh, slots=[0], picks=[0], group_size=g, pad_id=0)
    assert out["prompt_ids"].tolist() == [[0, 4, 4], [0, 4, 4], [7, 8, 9], [7, 8, 9]]  # left-padded
    assert out["prompt_mask"].tolist()[0] == [0, 1, 1]
    assert out["completion_ids"].tolist() == [[9, 9, 9, 9], [9, 9, 9, 0], [3, 3, 0, 0], [3, 0, 0, 0]]
    assert out["advantages"].tolist() == [0.5, -0.5, 1.0, -1.0]
    assert int(out["num_items_in_batch"]) == 4 + 3 + 2 + 1
    assert len(out["advantages"]) == len(batch["advantages"])  # never a smaller batch
    with pytest.raises(ValueError, match="pixel_values"):
        replace_groups({**batch, "pixel_values": torch.zeros(4, 1)}, {**fresh, "pixel_values": torch.zeros(4, 1)},
                       [0], [0], g, 0)


def test_sampling_metrics_never_divide_by_zero():
    import math

    from trainer.grpo_trainer import sampling_metrics

    m = sampling_metrics({})
    assert math.isnan(m["train/zero_std_groups_trained"]) and m["train/resample_replaced"] == 0
    m = sampling_metrics({"groups": 6, "zero_groups": 3, "replaced": 2, "rounds": 1, "trained_groups": 4,
                          "trained_zero_groups": 1})
    assert m["train/resample_zero_std_generated"] == 0.5 and m["train/zero_std_groups_trained"] == 0.25


# ----------------------------------------------------------------------------------------------------
# the cached warm start


def _tiny(**kw) -> TrainConfig:
    return TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "sft_steps": 1, "sft_batch_size": 2,
                                       "sft_instances": 2, **kw})


@pytest.fixture(scope="module")
def tiny_policy_path(embedded_model_path, tmp_path_factory) -> Path:
    """A two-block random Llama folder with the embedded model's tokenizer, for the tests below that check the
    warm-start cache and TRL's sampling bookkeeping, never what the model says (tests/support/tiny_llama.py)."""
    from tests.support.tiny_llama import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedded_model_path)


def _spec(model_dir, cfg, seed: int, task: str = "mapf"):
    from trainer.sft import warm_start_levels, warm_start_spec

    return warm_start_spec(model_dir, cfg, seed, warm_start_levels(task, cfg), task=task)


def test_warm_start_key_follows_model_settings_and_seed(embedded_model_path, tmp_path):
    from trainer.sft import warm_start_key, warm_start_spec

    base = warm_start_key(_spec(embedded_model_path, _tiny(), 0))
    # MAPF's levels are its sft_sizes: the key of a start built before the levels were an argument (no `levels`)
    assert "levels" not in _spec(embedded_model_path, _tiny(), 0) and "task" not in _spec(embedded_model_path, _tiny(), 0)
    assert warm_start_key(warm_start_spec(embedded_model_path, _tiny(), 0, [3], task="mapf")) == base
    assert warm_start_key(warm_start_spec(embedded_model_path, _tiny(), 0, [3, 4], task="mapf")) != base
    with pytest.raises(ValueError, match=r"warm-start level 11 of task 'mapf': allowed: 3, 4, 5, 6, 7, 8, 9, 10"):
        warm_start_spec(embedded_model_path, _tiny(), 0, [3, 11], task="mapf")
    # a level-share task's own levels, all of them by default; a level it lacks is refused
    toy = "tests.support.toy_task:ToyTask"
    assert _spec(embedded_model_path, _tiny(), 0, toy)["task"] == "toy-add"
    assert "levels" not in _spec(embedded_model_path, _tiny(), 0, toy)
    with pytest.raises(ValueError, match=r"warm-start level 4 of task 'toy-add': allowed: 1, 2, 3"):
        warm_start_spec(embedded_model_path, _tiny(), 0, [1, 4], task=toy)
    assert warm_start_key(_spec(embedded_model_path, _tiny(), 0)) == base  # stable
    assert warm_start_key(_spec(embedded_model_path, _tiny(), 1)) != base  # seed
    assert warm_start_key(_spec(embedded_model_path, _tiny(sft_lr=1e-5), 0)) != base  # a setting
    assert warm_start_key(_spec(embedded_model_path, _tiny(prompt_style="full"), 0)) != base
    # GRPO-only settings do not split the cache
    assert warm_start_key(_spec(embedded_model_path, _tiny(learning_rate=1e-6, max_steps=9), 0)) == base
    # the blocks the warm start trains count, not how they are spelled: GRPO may train other blocks (smoke: 2)
    assert warm_start_key(_spec(embedded_model_path, _tiny(train_layers=0, sft_train_layers=2), 0)) == base
    assert warm_start_key(_spec(embedded_model_path, _tiny(sft_train_layers=2), 0)) == base
    assert warm_start_key(_spec(embedded_model_path, _tiny(train_layers=0), 0)) != base
    assert warm_start_key(_spec(embedded_model_path, _tiny(sft_train_layers=0), 0)) != base
    other = tmp_path / "other-model"
    other.mkdir()
    for f in embedded_model_path.iterdir():
        if f.is_file():
            (other / f.name).write_bytes(f.read_bytes())
    assert warm_start_key(_spec(other, _tiny(), 0)) != base  # another folder name: another model
    w = next(other.glob("*.safetensors"))
    data = bytearray(w.read_bytes())
    renamed = tmp_path / embedded_model_path.name
    other.rename(renamed)
    assert warm_start_key(_spec(renamed, _tiny(), 0)) == base  # a byte-identical copy: same model
    data[len(data) // 2] ^= 0xFF
    data[100] ^= 0xFF
    (renamed / w.name).write_bytes(bytes(data))
    assert warm_start_key(_spec(renamed, _tiny(), 0)) != base  # retrained weights: another model


def test_check_cached_detects_missing_truncated_and_corrupt_files(tmp_path):
    import hashlib

    from trainer.sft import MANIFEST, check_cached

    entry = tmp_path / "k"
    entry.mkdir()
    (entry / "model.safetensors").write_bytes(b"x" * 1000)
    files = {"model.safetensors": [1000, hashlib.sha256(b"x" * 1000).hexdigest()]}
    assert "manifest" in check_cached(entry)  # half-written: no manifest yet
    (entry / MANIFEST).write_text(json.dumps({"spec": {"a": 1}, "files": files}))
    assert check_cached(entry, {"a": 1}) is None
    assert "spec differs" in check_cached(entry, {"a": 2})
    (entry / "model.safetensors").write_bytes(b"x" * 999)
    assert "999 bytes" in check_cached(entry, {"a": 1})
    (entry / "model.safetensors").write_bytes(b"y" + b"x" * 999)
    assert "SHA-256" in check_cached(entry, {"a": 1})
    (entry / "model.safetensors").unlink()
    assert "missing" in check_cached(entry, {"a": 1})
    (entry / MANIFEST).write_text("{not json")
    assert "manifest" in check_cached(entry, {"a": 1})


@pytest.mark.slow
def test_warm_start_cache_is_built_once_reused_and_rebuilt_when_corrupt(tiny_policy_path, tmp_path):
    import os

    from trainer.files import weights_sha256
    from trainer.provenance import machine
    from trainer.sft import build_warm_start, check_cached, warm_start_root

    cfg = _tiny()
    first = build_warm_start(tiny_policy_path, cfg, 0, [3], task="mapf", cache_dir=tmp_path, progress=False)
    assert not first["hit"] and Path(first["path"]).parent == warm_start_root(tmp_path)
    assert first["metrics"]["sft/steps"] == 1
    entry = Path(first["path"])
    assert check_cached(entry) is None
    # where and when it was built, and its weights, as a reuse will report them
    assert first["built"]["machine"]["cpu"] == machine()["cpu"] and first["built"]["packages"]["torch"]
    assert first["weights"] == weights_sha256(entry) and len(first["weights"]["model.safetensors"]) == 64
    stamp = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}
    again = build_warm_start(tiny_policy_path, cfg, 0, [3], task="mapf", cache_dir=tmp_path, progress=False)
    assert again["hit"] and again["key"] == first["key"] and again["metrics"] == first["metrics"]
    assert (again["built"], again["weights"]) == (first["built"], first["weights"])
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == stamp  # reused, not rewritten
    # another seed: another entry beside it
    other = build_warm_start(tiny_policy_path, cfg, 1, [3], task="mapf", cache_dir=tmp_path, progress=False)
    assert not other["hit"] and other["key"] != first["key"]
    # a corrupt weight file is detected and rebuilt, never loaded
    w = next(entry.glob("*.safetensors"))
    with open(w, "r+b") as f:
        f.seek(os.path.getsize(w) // 2)
        f.write(b"\x00\x01\x02\x03")
    rebuilt = build_warm_start(tiny_policy_path, cfg, 0, [3], task="mapf", cache_dir=tmp_path, progress=False)
    assert not rebuilt["hit"] and check_cached(Path(rebuilt["path"])) is None
    # a half-written entry (no manifest) is rebuilt too
    (entry / "warm_start.json").unlink()
    assert not build_warm_start(tiny_policy_path, cfg, 0, [3], task="mapf", cache_dir=tmp_path, progress=False)["hit"]
    assert not list(warm_start_root(tmp_path).glob(".*.tmp"))  # no leftovers


@pytest.mark.slow
def test_nodes_sft_cli_builds_then_reuses(tiny_policy_path, tmp_path, monkeypatch, capsys):
    from trainer.sft import main

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path))
    monkeypatch.setattr("llm_backends.models.resolve_model", lambda name, cache_dir=None: tiny_policy_path)
    args = ["--preset", "smoke", "--set", "sft_steps=1", "--set", "train.sft_instances=2"]
    main(args)
    out = json.loads(capsys.readouterr().out)
    assert out["reused"] is False and Path(out["path"]).is_dir() and out["sft/steps"] == 1
    main(args)
    again = json.loads(capsys.readouterr().out)
    assert again["reused"] is True and again["weights"] == out["weights"] and again["built_at"] == out["built_at"]
    assert out["built_on"] and len(out["weights"]["model.safetensors"]) == 64
    with pytest.raises(SystemExit):
        main(["--set", "no_such=1"])
    assert "no_such" in capsys.readouterr().err


@pytest.mark.slow
def test_dynamic_sampling_replaces_dead_groups_in_a_real_grpo_step(tiny_policy_path, tmp_path):
    """A real TRL step: prompts of one kind always score 0 (a dead group), the others score by completion length
    (signal). Dead groups are replaced by fresh groups with signal, the batch keeps its size, the stats say so."""
    import random

    from datasets import Dataset

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import make_trainer_class, sampling_metrics
    from trainer.trl_setup import grpo_config

    model, tok = load_checkpoint(tiny_policy_path, trainable=True)
    rows = [{"prompt": [{"role": "user", "content": f"Say a number ({i})."}], "dead": i % 2 == 0} for i in range(16)]
    sizes = []

    def reward(completions, dead, **kw):
        sizes.append(len(completions))
        return [0.0 if d else float(len(c[0]["content"]) % 7) + random.random() for c, d in zip(completions, dead, strict=True)]

    reward.__name__ = "toy"
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "max_completion_length": 8,
                                      "num_generations": 2, "per_device_train_batch_size": 4, "train_layers": 1,
                                      "resample_rounds": 3})
    args = grpo_config(cfg, tmp_path, 0, progress=False)
    args.group_key = "dead"  # the replacement draw leans by this column
    trainer = make_trainer_class(use_vllm=False)(
        model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
    )
    trained_sizes = []
    orig = trainer._generate_and_score_completions

    def spy(inputs):
        out = orig(inputs)
        trained_sizes.append(len(out["advantages"]))
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    st = trainer.stats
    assert trainer.state.global_step == 2
    assert trained_sizes == [4, 4]  # never a smaller (or empty) batch
    assert st["zero_groups"] >= 1 and st["replaced"] >= 1 and st["rounds"] >= 1
    assert st["trained_zero_groups"] < st["zero_groups"]
    # per key: [groups with variance, groups]; dead prompts never have any, the others do
    assert trainer.key_stats[True][0] == 0 and trainer.key_stats[True][1] >= 1
    assert trainer.key_stats[False][0] >= 1
    m = sampling_metrics(st)
    assert m["train/zero_std_groups_trained"] < m["train/resample_zero_std_generated"]


@pytest.mark.slow
def test_num_iterations_reuses_each_generated_batch_for_several_optimiser_steps(tiny_policy_path, tmp_path):
    """train.num_iterations=2 with 4 optimiser steps: TRL samples and scores 2 batches, not 4, and every step
    still moves the weights (the reused batch is scored against its sampling log-probs)."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import make_trainer_class
    from trainer.trl_setup import grpo_config

    model, tok = load_checkpoint(tiny_policy_path, trainable=True)
    rows = [{"prompt": [{"role": "user", "content": f"Say a number ({i})."}]} for i in range(16)]
    calls = []

    def reward(completions, **kw):
        calls.append(len(completions))
        return [float(len(c[0]["content"]) % 5) for c in completions]

    reward.__name__ = "toy"
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 4, "num_iterations": 2,
                                      "max_completion_length": 8, "num_generations": 2,
                                      "per_device_train_batch_size": 4, "train_layers": 1})
    args = grpo_config(cfg, tmp_path, 0, progress=False)
    assert args.num_iterations == 2
    trainer = make_trainer_class(use_vllm=False)(model=model, reward_funcs=[reward], args=args,
                                   train_dataset=Dataset.from_list(rows), processing_class=tok)
    moved = []
    top = [p for p in model.parameters() if p.requires_grad][-1]
    before = top.detach().clone()

    class Watch(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            moved.append(not bool((top.detach() == before).all()))
            before.copy_(top.detach())

    trainer.add_callback(Watch())
    trainer.train()
    assert trainer.state.global_step == 4
    assert calls == [4, 4]  # two generated batches of 4 completions for four steps
    assert all(moved), moved
    with pytest.raises(ValueError, match="num_iterations"):
        TrainConfig(num_iterations=0)


# ----------------------------------------------------------------------------------------------------
# GRPO's completions scored over one forward of their shared prompt


def _shared_prompt_batch(pad: int = 0):
    """4 rows: one 30-token prompt (after `pad` columns of common left padding), answers of 12, 9, 12 and 5 tokens
    (right-padded), TRL's layout."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 1000, (30,), generator=g)
    answers = torch.randint(5, 1000, (4, 12), generator=g)
    lengths = [12, 9, 12, 5]
    ids = torch.cat([torch.full((4, pad), 2), prompt.expand(4, 30), answers], dim=1)
    mask = torch.cat([torch.zeros(4, pad, dtype=torch.long), torch.ones(4, 30, dtype=torch.long),
                      torch.tensor([[1] * n + [0] * (12 - n) for n in lengths])], dim=1)
    ids[:, pad + 30:][mask[:, pad + 30:] == 0] = 2
    return ids, mask


@pytest.mark.parametrize("pad", [0, 3])
def test_shared_prompt_scores_and_gradients_equal_trls_path(pad):
    """The shared-prompt path gives TRL's log-probs, entropies and gradients for a batch of one prompt; it runs the
    prompt once. With common left padding it equals TRL's path on the same batch without that padding. Both
    paths run on the same model: a small random Llama (SmolLM2's architecture), as the token ids are random too."""
    import contextlib
    import types

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from trainer.trl_cpu import per_token_logps, score_with_shared_prompt, shared_prompt

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2, pad_token_id=2,
    ))
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids, mask = _shared_prompt_batch(pad)
    trl_self = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext))
    span = shared_prompt(model, ids, mask, 12, gradient_checkpointing=False, multimodal=False, aux_loss=False)
    assert span == (pad, pad + 30)

    def loss_and_grads(fn):
        model.zero_grad()
        logps, ent = fn()
        loss = (logps * mask[:, -12:]).sum() + (ent * mask[:, -12:]).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logps.detach(), ent.detach(), grads

    ref_lp, ref_ent, ref_g = loss_and_grads(lambda: GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
        trl_self, model, ids[:, pad:], mask[:, pad:], 12, compute_entropy=True)[:2])
    calls = []
    backbone = model.base_model
    original = backbone.forward
    backbone.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or original(*a, **k)
    try:
        lp, ent, g = loss_and_grads(lambda: score_with_shared_prompt(
            model, ids, mask, 12, pad, contextlib.nullcontext, compute_entropy=True))
    finally:
        backbone.forward = original
    assert calls == [(1, 29), (4, 13)]  # the prompt once; each row: its last prompt token and its answer
    real = mask[:, -12:].bool()
    assert torch.allclose(lp[real], ref_lp[real], atol=1e-4)
    assert torch.allclose(ent[real], ref_ent[real], atol=1e-4)
    assert set(g) == set(ref_g)
    for name in ref_g:  # float32 sums in another order (one prompt row vs four): off by ~1e-5 of its scale here
        scale = ref_g[name].abs().max().item()
        assert (g[name] - ref_g[name]).abs().max().item() <= 1e-3 * scale, name
        assert (g[name] - ref_g[name]).norm().item() <= 3e-4 * ref_g[name].norm().item(), name

    # the trainer's hook: a shared batch never reaches TRL's path; with share_prompt off, every batch does
    trl_calls = []

    def trl_path(*a, **k):
        trl_calls.append(k)
        return GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(trl_self, *a, **k)

    trainer = types.SimpleNamespace(share_prompt=True, shared_prompt_batches=0, accelerator=trl_self.accelerator)
    with torch.no_grad():
        hooked = per_token_logps(trainer, trl_path, model, ids, mask, 12, batch_size=3, compute_entropy=True)
        assert trainer.shared_prompt_batches == 1 and not trl_calls
        assert torch.allclose(hooked[0][real], ref_lp[real], atol=1e-4)  # chunked by batch_size as TRL chunks
        trainer.share_prompt = False
        per_token_logps(trainer, trl_path, model, ids[:, pad:], mask[:, pad:], 12, compute_entropy=True)
        assert trainer.shared_prompt_batches == 1 and len(trl_calls) == 1


def test_shared_prompt_refuses_batches_it_cannot_share():
    import types

    import torch

    from trainer.trl_cpu import shared_prompt

    ids, mask = _shared_prompt_batch()
    model = types.SimpleNamespace(base_model=object())
    ok = dict(gradient_checkpointing=False, multimodal=False, aux_loss=False)
    assert shared_prompt(model, ids, mask, 12, **ok) == (0, 30)
    other = ids.clone()
    other[2, 10] += 1  # one row with another prompt
    assert shared_prompt(model, other, mask, 12, **ok) is None
    ragged = mask.clone()
    ragged[1, 0] = 0  # one row padded where the others are not
    assert shared_prompt(model, ids, ragged, 12, **ok) is None
    assert shared_prompt(model, ids[:1], mask[:1], 12, **ok) is None  # one row: nothing to share
    assert shared_prompt(model, ids, mask, 12, **{**ok, "gradient_checkpointing": True}) is None
    assert shared_prompt(model, ids, mask, 12, **{**ok, "multimodal": True}) is None
    assert shared_prompt(model, ids, mask, 12, **{**ok, "aux_loss": True}) is None  # MoE: TRL's path
    peft = types.SimpleNamespace(base_model=object(), peft_config={})
    assert shared_prompt(peft, ids, mask, 12, **ok) is None  # PEFT: TRL's path
    assert torch.equal(ids, _shared_prompt_batch()[0])  # nothing was changed in place
