"""GRPO's rollout copy and bf16 autocast: completions sampled by a bf16 copy of the policy that follows
every optimiser step, training under autocast over float32 weights; where each is on, and where it is not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.trl_setup import rollout_dtype, rollout_prepack, use_autocast


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_auto_follows_the_cpu_and_explicit_values_win(monkeypatch, bf16_cpu):
    monkeypatch.setattr("llm_backends.vllm_server.cpu_has_bf16", lambda *a: bf16_cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fp32 = torch.nn.Linear(2, 2)
    # no bf16 hardware: a float32 copy, the copy's sampler without bf16's software multiplies
    assert rollout_dtype(TrainConfig(), fp32) == ("bfloat16" if bf16_cpu else "float32")
    assert rollout_dtype(TrainConfig(rollout_dtype="float32"), fp32) == "float32"
    assert use_autocast(TrainConfig()) is bf16_cpu
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16"), fp32) == "bfloat16"
    assert rollout_dtype(TrainConfig(rollout_dtype="model"), fp32) is None
    assert use_autocast(TrainConfig(autocast_bf16=False)) is False
    assert use_autocast(TrainConfig(autocast_bf16=True)) is True
    # never a copy of a bf16 model, of a peft adapter, or beside vLLM; never autocast over bf16 weights
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16"), fp32.to(torch.bfloat16)) is None
    assert rollout_dtype(TrainConfig(rollout_dtype="float32"), fp32.to(torch.bfloat16)) is None
    adapter = torch.nn.Linear(2, 2)
    adapter.peft_config = {}
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16"), adapter) is None
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16", use_vllm=True), fp32) is None
    assert use_autocast(TrainConfig(bf16=True, autocast_bf16=True)) is False


def test_prepack_is_for_a_float32_copy_unless_told(monkeypatch):
    assert rollout_prepack(TrainConfig(), "float32") is torch.backends.mkldnn.is_available()
    assert rollout_prepack(TrainConfig(), "bfloat16") is False  # not measured: off unless asked
    assert rollout_prepack(TrainConfig(rollout_prepack=True), "float32") is torch.backends.mkldnn.is_available()
    assert rollout_prepack(TrainConfig(rollout_prepack=False), "float32") is False
    assert rollout_prepack(TrainConfig(rollout_prepack=True), None) is False  # no copy: nothing to pack
    # asked for where it cannot run: one error naming the setting and what is missing
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match=r"rollout_prepack=true: this CPU has no oneDNN bf16 support.*allowed here"):
        rollout_prepack(TrainConfig(rollout_prepack=True), "bfloat16")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert rollout_prepack(TrainConfig(rollout_prepack=True), "bfloat16") is True
    with pytest.raises(ValueError, match="not the copy's float16"):
        rollout_prepack(TrainConfig(rollout_prepack=True), "float16")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert rollout_prepack(TrainConfig(), "float32") is False
    with pytest.raises(ValueError, match="no oneDNN"):
        rollout_prepack(TrainConfig(rollout_prepack=True), "float32")
    with pytest.raises(ValueError, match="rollout_prepack"):
        TrainConfig(rollout_prepack="sometimes")


@pytest.mark.parametrize("top", [2, 0])
def test_packed_float32_copy_answers_as_the_model_and_follows_every_sync(embedded_model_path, top):
    """The float32 copy on oneDNN-packed weights: every Linear runs packed; its greedy answers are transformers' own
    on the model (token for token, or parting only at a near tie of the model's scores, where oneDNN's rounding may
    pick the other token); and after the trained weights move, a sync re-packs them, so the copy scores as the moved
    model does (a stale pack would still score as the old one). `top` 0 trains every weight, the embedding too,
    and with it the tied LM head's pack."""
    from transformers import GenerationConfig

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import RolloutCopy
    from trainer.trl_setup import freeze_lower_layers

    model, tok = load_checkpoint(embedded_model_path, trainable=True)
    if top:
        freeze_lower_layers(model, top)
    model.eval()
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
             for c in ("Map 3x3, H = hole:\n...\n.H.\n...\nAgent 0: (0,0) -> (2,2)", "Say hi.")]
    enc = tok([t for t in texts for _ in range(3)], return_tensors="pt", padding=True)
    cfg = GenerationConfig(max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id, output_logits=True,
                           return_dict_in_generate=True)
    with torch.no_grad():
        ref = model.generate(**enc, generation_config=cfg)
    sampler = RolloutCopy(torch.float32, prepack=True)
    copy = sampler.synced(model, step=0)
    linears = [m for m in copy.modules() if type(m) is torch.nn.Linear]
    assert linears and all(hasattr(m, "packed_weight") and m.forward.func.__name__ == "_packed_linear_forward"
                           for m in linears)
    assert id(copy.lm_head.weight) in sampler.packed  # the tied head too
    with torch.no_grad():
        out = copy.generate(**enc, generation_config=cfg)
        if not torch.equal(out.sequences, ref.sequences):
            start = enc.input_ids.shape[1]
            col = int((out.sequences[:, start:] != ref.sequences[:, start:]).any(0).nonzero()[0])
            rows = (out.sequences[:, start + col] != ref.sequences[:, start + col]).nonzero().flatten()
            top2 = ref.logits[col][rows].topk(2, dim=-1).values
            assert (top2[:, 0] - top2[:, 1]).max() < 1e-3, "the packed copy parted from the model away from a tie"
        before = copy(**enc).logits
        torch.manual_seed(0)
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p), alpha=0.02)
        moved = model(**enc).logits
        assert (moved - before).abs().max() > 0.5  # the trained weights did move the scores
        assert sampler.synced(model, step=1) is copy
        # float32 rounding through 30 blocks (oneDNN's against MKL's products) is about 1e-3 on scores of 10-30
        assert (copy(**enc).logits - moved).abs().max() < 0.02


def test_cuda_gets_neither(monkeypatch):
    monkeypatch.setattr("llm_backends.vllm_server.cpu_has_bf16", lambda *a: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rollout_dtype(TrainConfig(), torch.nn.Linear(2, 2)) is None
    assert use_autocast(TrainConfig(bf16=False)) is False


def test_smoke_pins_float32_and_bad_values_are_named():
    smoke = TrainConfig.model_validate(TRAIN_PRESETS["smoke"])
    assert smoke.rollout_dtype == "model" and smoke.autocast_bf16 is False
    with pytest.raises(ValueError, match="rollout_dtype"):
        TrainConfig(rollout_dtype="float16")


@pytest.mark.slow
def test_rollout_copy_samples_with_its_own_bf16_weights_and_follows_training(embedded_model_path, tmp_path):
    """A real TRL run of 2 steps: every completion comes from the bf16 copy (the trained model's forward is never
    called while generating) and its tokens are drawn by inverse CDF (never torch.multinomial), the copy is
    re-synced after the optimiser step, and training keeps float32 weights under autocast."""
    from datasets import Dataset

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import make_trainer_class
    from trainer.trl_setup import grpo_config

    model, tok = load_checkpoint(embedded_model_path, trainable=True)
    rows = [{"prompt": [{"role": "user", "content": f"Say a number ({i})."}]} for i in range(8)]

    def reward(completions, **kw):
        return [float(len(c[0]["content"]) % 5) for c in completions]

    reward.__name__ = "toy"
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "max_completion_length": 8,
                                      "num_generations": 2, "per_device_train_batch_size": 4, "train_layers": 1,
                                      "learning_rate": 1e-3, "rollout_dtype": "bfloat16", "autocast_bf16": True})
    trainer = make_trainer_class(use_vllm=False)(
        model=model, reward_funcs=[reward], args=grpo_config(cfg, tmp_path, 0, progress=False),
        train_dataset=Dataset.from_list(rows), processing_class=tok,
    )
    assert trainer.rollout_dtype == rollout_dtype(cfg, model) == "bfloat16"  # the config's knob, resolved
    assert trainer.args.bf16  # accelerate's autocast ...
    calls = {"trained": 0, "copy": 0, "generating": False}
    model.model.layers[0].register_forward_hook(
        lambda *a: calls.__setitem__("trained", calls["trained"] + calls["generating"]))
    orig = trainer._generate_single_turn

    def spy(*a, **kw):
        calls["generating"] = True
        try:
            return orig(*a, **kw)
        finally:
            calls["generating"] = False

    trainer._generate_single_turn = spy
    first = {n: p.detach().clone() for n, p in model.named_parameters()}
    multinomial = torch.multinomial

    def spy_multinomial(*a, **kw):
        calls["multinomial"] = calls.get("multinomial", 0) + 1
        return multinomial(*a, **kw)

    torch.multinomial = spy_multinomial
    try:
        trainer.train()
    finally:
        torch.multinomial = multinomial
    assert "multinomial" not in calls  # TRL's sampled generate drew every token by inverse CDF

    copy = trainer.rollout.model
    assert copy is not None and copy is not model
    copy.model.layers[0].register_forward_hook(lambda *a: calls.__setitem__("copy", calls["copy"] + 1))
    trainer._generate_single_turn([tok("Say a number.").input_ids] * 2, None, {}, 2)
    assert calls["copy"] > 0 and calls["trained"] == 0  # sampling never ran the trained model
    assert trainer.rollout.syncs >= 1  # re-synced after the first optimiser step
    assert all(p.dtype == torch.bfloat16 for p in copy.parameters())
    assert copy.lm_head.weight is copy.model.embed_tokens.weight  # still tied
    assert copy.config._attn_implementation == "sdpa_gqa" and model.config._attn_implementation == "sdpa"
    buffers = dict(model.named_buffers())
    for n, b in copy.named_buffers():  # RoPE's inv_freq and the like stay float32, as in a model loaded in bf16
        assert b.dtype == buffers[n].dtype and torch.equal(b, buffers[n]), n
    assert all(p.dtype == torch.float32 for p in model.parameters())  # ... over float32 weights
    top = f"model.layers.{len(model.model.layers) - 1}.mlp.down_proj.weight"
    assert not torch.equal(first[top], model.state_dict()[top])  # the top block trained
    trainer.rollout.synced(model, step=trainer.state.global_step + 1)  # the next step's sync
    params = dict(copy.named_parameters())
    for n, p in model.named_parameters():  # trained and frozen weights alike: the policy, in bf16
        assert torch.equal(params[n], p.detach().to(torch.bfloat16)), n


def test_gqa_attention_of_the_copy_answers_as_sdpa_without_repeating_kv_heads(embedded_model_path, monkeypatch):
    """The copy's attention (`sdpa_gqa`) leaves the KV heads to torch's kernel: on a left-padded batch (a mask, as
    in every GRPO batch) it is really taken, every layer, and greedy answers equal transformers' sdpa token for
    token. The trained model keeps sdpa."""
    import copy

    import transformers.integrations.sdpa_attention as sdpa_mod

    from llm_backends.checkpoints import load_checkpoint
    from trainer.rollout_attention import GQA_SDPA, use_gqa_sdpa

    model, tok = load_checkpoint(embedded_model_path, trainable=False)
    model = model.to(torch.bfloat16).eval()
    fast = copy.deepcopy(model)
    assert use_gqa_sdpa(fast, decode_matmul=False)  # torch's kernel for every step (decode: the test below)
    assert fast.config._attn_implementation == GQA_SDPA + "_kernel" and model.config._attn_implementation == "sdpa"
    tok.padding_side = "left"
    prompts = ["Map 3x3, (row,col) from (0,0), H = hole:\n...\n.H.\n...\nAgent 0: (0,0) -> (2,2)", "Say hi."]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True)
    assert not enc.attention_mask.all()  # padded: transformers would repeat the KV heads here
    with torch.no_grad():
        ref = model.generate(**enc, max_new_tokens=24, do_sample=False)
    calls = {"gqa": 0, "repeat_kv": 0}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    repeat_kv = sdpa_mod.repeat_kv

    def spy_sdpa(*a, **kw):
        calls["gqa"] += bool(kw.get("enable_gqa"))
        return sdpa(*a, **kw)

    def spy_repeat(*a, **kw):
        calls["repeat_kv"] += 1
        return repeat_kv(*a, **kw)

    def spy_cat_update(*a, **kw):
        calls["cat"] = calls.get("cat", 0) + 1
        return cat_update(*a, **kw)

    from transformers.cache_utils import DynamicLayer

    from trainer.grpo_trainer import with_growing_cache

    cat_update = DynamicLayer.update
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy_sdpa)
    monkeypatch.setattr(sdpa_mod, "repeat_kv", spy_repeat)
    monkeypatch.setattr(DynamicLayer, "update", spy_cat_update)
    with torch.no_grad():
        out = fast.generate(**enc, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, ref)
    assert calls["repeat_kv"] == 0 and calls["gqa"] >= len(model.model.layers) * 2  # prefill and decode steps
    # transformers' own cache, one cat per layer and generated token: 24, or fewer where every row ended early (on a
    # CPU without bf16 hardware the bf16 answers differ, and both end after 21 tokens on an AMD EPYC Zen 3)
    generated = out.shape[1] - enc["input_ids"].shape[1]
    assert 8 <= generated <= 24 and calls["cat"] == len(model.model.layers) * generated
    assert with_growing_cache(fast) is fast
    calls["cat"] = 0
    with torch.no_grad():
        out = fast.generate(**enc, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, ref) and calls["cat"] == 0  # the growing cache: same tokens, no concatenation
    # decided on the settings generate resolved: the model's own generation config says no cache, so none is made
    fast.generation_config.use_cache = False
    with torch.no_grad():
        out = fast.generate(**enc, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, ref[:, : out.shape[1]])
    # a static cache asked for is transformers' own (no "both a cache and cache_implementation" error)
    fast.generation_config.use_cache = True
    with torch.no_grad():
        out = fast.generate(**enc, max_new_tokens=3, do_sample=False, cache_implementation="static")
    assert out.shape == (2, enc.input_ids.shape[1] + 3) and calls["cat"] == 0  # (attends over padding: bf16 sums differ)
    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    assert not use_gqa_sdpa(eager) and eager.config._attn_implementation == "eager"  # left alone


def test_growing_cache_holds_what_concatenation_would_across_its_growth():
    from trainer.grpo_trainer import growing_cache

    layer = growing_cache(1).layers[0]
    layer._room = 3  # grow often
    held_k, held_v = [], []
    g = torch.Generator().manual_seed(0)
    for n in (5, 1, 1, 1, 4, 1, 2, 1):  # a prefill, then tokens, crossing the spare room several times
        k, v = torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)
        held_k.append(k)
        held_v.append(v)
        keys, values = layer.update(k, v)
        assert torch.equal(keys, torch.cat(held_k, -2)) and torch.equal(values, torch.cat(held_v, -2))
        assert layer.get_seq_length() == sum(x.shape[-2] for x in held_k)
    layer.crop(-2)  # DynamicLayer's own methods work on the views; the next update starts from what they left
    k, v = torch.randn(2, 3, 1, 4, generator=g), torch.randn(2, 3, 1, 4, generator=g)
    keys, _ = layer.update(k, v)
    assert torch.equal(keys, torch.cat([torch.cat(held_k, -2)[..., :-2, :], k], -2))


def test_inverse_cdf_draws_the_softmax_distribution():
    """`InverseCdfSampling` samples softmax(scores): frequencies over 40,000 draws match it, a masked token (-inf)
    is never drawn, and what goes out is one-hot (0 at the draw, -inf elsewhere) for the loop's argmax."""
    from trainer.rollout_sampling import _inverse_cdf_class

    torch.manual_seed(0)
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf"), 0.5], [0.0, 0.0, 3.0, 0.0, 0.0, float("-inf")]])
    sampler = _inverse_cdf_class()()
    n = 40_000
    drawn = torch.stack([sampler(None, scores).argmax(-1) for _ in range(n)])  # [n, 2]
    out = sampler(None, scores)
    assert ((out == 0).sum(-1) == 1).all() and ((out == 0) | (out == float("-inf"))).all()
    expected = torch.softmax(scores, -1)
    for row in range(2):
        freq = torch.bincount(drawn[:, row], minlength=6).float() / n
        assert (freq - expected[row]).abs().max() < 0.01, (row, freq, expected[row])
    assert (drawn[:, 0] != 4).all() and (drawn[:, 1] != 5).all()


def test_copy_samples_by_inverse_cdf_after_transformers_warpers(embedded_model_path, monkeypatch):
    """`with_rollout_decoding`: a sampled `generate` (TRL's call: a generation config) never calls
    torch.multinomial, still goes through the warpers transformers builds (top_k=1 gives the greedy answer), and
    samples (rows of one prompt differ at T 1.0)."""
    from transformers import GenerationConfig

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import with_rollout_decoding

    model, tok = load_checkpoint(embedded_model_path, trainable=False)
    model = model.eval()
    text = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}], tokenize=False,
                                   add_generation_prompt=True)
    enc = tok([text] * 4, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert with_rollout_decoding(model) is model

    def no_multinomial(*a, **kw):
        raise AssertionError("torch.multinomial called")

    monkeypatch.setattr(torch, "multinomial", no_multinomial)
    common = dict(max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.no_grad():
        top1 = model.generate(**enc, generation_config=GenerationConfig(do_sample=True, top_k=1, temperature=0.7,
                                                                        **common))
        sampled = model.generate(**enc, generation_config=GenerationConfig(do_sample=True, top_k=0, temperature=1.0,
                                                                           **common))
    assert torch.equal(top1, ref)
    assert len({tuple(r.tolist()) for r in sampled}) > 1  # four draws of one prompt at T 1.0 are not all alike


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rollout_copy_prefills_each_prompt_once_with_the_same_answers(embedded_model_path, dtype):
    """TRL's batch repeats each prompt (here 2 prompts of different lengths, left-padded, x 3): the rollout copy
    prefills the 2 distinct prompts once, over all but their last token, then every row's last token. In float32
    its greedy answers equal transformers' own prefill of all 6 rows, token for token. In bf16 a batch of another
    shape rounds differently, so its first-token distribution is held to the float32 policy's instead, as close
    as the copy's without the shared prefill (KL about 0.001 here; a wrong position or cache row gives far more)."""
    from transformers import GenerationConfig

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import RolloutCopy

    model, tok = load_checkpoint(embedded_model_path, trainable=False)
    model = model.eval()
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
             for c in ("Map 3x3, H = hole:\n...\n.H.\n...\nAgent 0: (0,0) -> (2,2)", "Say hi.")]
    enc = tok([t for t in texts for _ in range(3)], return_tensors="pt", padding=True)
    assert not enc.attention_mask.all()
    cfg = GenerationConfig(max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id, output_logits=True,
                           return_dict_in_generate=True)
    with torch.no_grad():
        ref = model.generate(**enc, generation_config=cfg)
    copy = RolloutCopy(dtype).synced(model, step=0)
    rows = []
    copy.model.embed_tokens.register_forward_pre_hook(lambda m, a: rows.append(tuple(a[0].shape)))
    with torch.no_grad():
        out = copy.generate(**enc, generation_config=cfg)
    length = enc.input_ids.shape[1]
    assert rows[:2] == [(2, length - 1), (6, 1)]  # 2 distinct prompts once, then each row's last prompt token
    if dtype == torch.float32:
        assert torch.equal(out.sequences, ref.sequences)
        return
    policy = torch.log_softmax(ref.logits[0], -1)

    def kl(logits):
        return (policy.exp() * (policy - torch.log_softmax(logits, -1))).sum(-1)

    copy.__dict__.pop("generate")  # the same bf16 copy, transformers' own prefill of every row
    with torch.no_grad():
        unshared = copy.generate(**enc, generation_config=cfg)
    assert kl(unshared.logits[0]).max() < 0.005
    assert kl(out.logits[0]).max() < 0.005, kl(out.logits[0])


def test_rollout_copy_prefills_once_when_rows_need_no_padding(embedded_model_path):
    """Rows of one length (one prompt repeated, as every row of a 1-prompt GRPO batch; or prompts that tokenize to
    the same length) have no padding, and generate drops their all-ones mask. The shared prefill must still run,
    and in float32 give transformers' own answers token for token."""
    from transformers import GenerationConfig

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import RolloutCopy

    model, tok = load_checkpoint(embedded_model_path, trainable=False)
    model = model.eval()
    text = tok.apply_chat_template([{"role": "user", "content": "Map 3x3, H = hole:\n...\n.H.\n...\nAgent 0: (0,0) -> "
                                     "(2,2)"}], tokenize=False, add_generation_prompt=True)
    enc = tok([text] * 4, return_tensors="pt", padding=True)
    assert enc.attention_mask.all()
    cfg = GenerationConfig(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        ref = model.generate(**enc, generation_config=cfg)
    copy = RolloutCopy(torch.float32).synced(model, step=0)
    rows = []
    copy.model.embed_tokens.register_forward_pre_hook(lambda m, a: rows.append(tuple(a[0].shape)))
    with torch.no_grad():
        out = copy.generate(**enc, generation_config=cfg)
    length = enc.input_ids.shape[1]
    assert rows[:2] == [(1, length - 1), (4, 1)]  # the prompt once, then each row's last prompt token
    assert torch.equal(out, ref)


@pytest.mark.parametrize("keys_first", [True, False])
@pytest.mark.parametrize("mask", ["bool", "additive", None])
def test_decode_attention_is_sdpa_with_repeated_kv_heads(mask, keys_first):
    """One new token per row: the two grouped matmuls give what torch's sdpa gives over the repeated KV heads
    (query head h reads KV head h // 3), with a boolean or additive padding mask or none, and a given scale; keys
    and values are views of larger buffers, as the growing cache passes them; both forms of the scores (keys times
    queries, and the bench's stop-33 queries times keys)."""
    from trainer.rollout_attention import _decode_attention

    torch.manual_seed(0)
    rows, heads, kv, dim, length = 4, 9, 3, 64, 37
    q = torch.randn(rows, heads, 1, dim)
    kbuf, vbuf = torch.randn(rows, kv, length + 19, dim), torch.randn(rows, kv, length + 19, dim)
    k, v = kbuf[:, :, :length], vbuf[:, :, :length]
    kb, vb = kbuf.bfloat16()[:, :, :length], vbuf.bfloat16()[:, :, :length]  # views of buffers, as the cache's
    assert not kb.is_contiguous()
    keep = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    keep[0, ..., :5] = keep[2, ..., :11] = False  # left padding of two rows
    given = {"bool": keep, "additive": torch.zeros(keep.shape).masked_fill(~keep, float("-inf")), None: None}[mask]

    def sdpa(attend, scale):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=attend, scale=scale).transpose(1, 2)

    for scale in (None, 0.05):
        out = _decode_attention(q.bfloat16(), kb, vb, given, scale, keys_first)
        assert out.shape == (rows, 1, heads, dim) and out.dtype == torch.bfloat16 and out.is_contiguous()
        ref = sdpa(None if mask is None else keep, scale)
        assert (out.float() - ref).abs().max() < 0.03
        if mask is not None:  # the padding really is masked: attending to it gives other numbers
            assert (sdpa(None, scale) - ref)[[0, 2]].abs().max() > 0.1


def test_bf16_copy_decodes_without_torch_sdpa_and_scores_as_the_policy(embedded_model_path, monkeypatch):
    """In the bf16 rollout copy no decode step (one new token per row) reaches torch's sdpa kernel, which is
    7-12x slower than the matmuls at this shape on a CPU without AMX; only the prompt's prefill does. What the copy
    then scores at every generated position is the float32 policy's distribution up to bf16 rounding (a wrong
    attention would not be: KL of several nats). With `decode_matmul` off, decode steps do reach the kernel."""
    from transformers import GenerationConfig

    from llm_backends.checkpoints import load_checkpoint
    from trainer.grpo_trainer import RolloutCopy
    from trainer.rollout_attention import use_gqa_sdpa

    model, tok = load_checkpoint(embedded_model_path, trainable=False)
    model = model.eval()
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in ("Map 3x3, H = hole:\n...\n.H.\n...\nAgent 0: (0,0) -> (2,2)", "Say hi.")]
    enc = tok(texts, return_tensors="pt", padding=True)
    cfg = GenerationConfig(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id,
                           output_logits=True, return_dict_in_generate=True)
    copy = RolloutCopy(torch.bfloat16).synced(model, step=0)
    lengths = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, *a, **kw):
        lengths.append(query.shape[2])
        return sdpa(query, *a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        out = copy.generate(**enc, generation_config=cfg)
    assert lengths and 1 not in lengths  # the prefill only
    n = enc.input_ids.shape[1]
    mask = torch.cat([enc.attention_mask, torch.ones(2, 12, dtype=torch.long)], 1)
    with torch.no_grad():
        policy = model(out.sequences, attention_mask=mask).logits[:, n - 1:-1].float().log_softmax(-1)
    sampled = torch.stack(out.logits, 1).float().log_softmax(-1)
    kl = (policy.exp() * (policy - sampled)).sum(-1)
    assert kl.max() < 0.02, kl
    lengths.clear()
    use_gqa_sdpa(copy, decode_matmul=False)
    with torch.no_grad():
        copy.generate(**enc, generation_config=cfg)
    assert lengths.count(1) >= len(model.model.layers) * 11
