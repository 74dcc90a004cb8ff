"""The sampler of reward-filtered fine-tuning (`trainer.filtered`) and of the benches' in-process evaluation.

One object, `FilteredSampler(how)`, called once a round with the trained model and the optimiser step it is at:
`sampler(model, tok, prompts, n=8, temperature=0.7, max_new_tokens=16, version=step)` gives `n` answers to each
chat prompt (`temperature` 0: one greedy answer each). Three ways to compute them (`train.filtered_sampler`):

- `rollout`: GRPO's rollout copy of the policy (`trainer.grpo_trainer.RolloutCopy`): a bf16 copy where the CPU
  multiplies bf16 in hardware (float32 elsewhere), each distinct prompt prefilled once, a growing KV cache, GQA
  attention as two matmuls, tokens drawn by inverse CDF. Its weights are copied from the trained model when
  `version` moved (a fraction of a second for 135M parameters).
- `vllm`: the project's vLLM server (`llm_backends.vllm_server.VLLMServer`), started on the first call from the
  model's weights saved to a scratch folder and reloaded in place (`reload_weights`) when `version` moved. One
  HTTP request a round, the prompts as token ids (the very tokens transformers would see).
- `generate`: transformers' `generate` on the trained float32 model itself (bf16 autocast with `bf16`), the
  stage's sampler before the other two.

`evals.bench.bench_filtered_sampling` measures the three side by side. On the `rg-cpu` round (32 prompts x 8
answers of at most 16 tokens, 2 shared cores) the vLLM server, weight reload included, was 9.9x transformers'
generate and the rollout copy 2.0x (docs/learning-log.md): `auto` (the `rg-cpu` preset's) takes the server where vLLM's CPU build is installed, the
rollout copy elsewhere. `rollout` is the setting's default (`DEFAULT_SAMPLER`): it needs no server, so it also
serves models vLLM cannot (a head size its CPU attention lacks). The samples are only verified and filtered, never differentiated: a bf16 sampler's rounding
makes them slightly off-policy, and the filtered stage, unlike GRPO, weighs nothing by their probability.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

SAMPLERS = ("rollout", "vllm", "generate")
CHOICES = ("auto", *SAMPLERS)  # auto: `resolve_sampler`
DEFAULT_SAMPLER = "rollout"


def resolve_sampler(how: str) -> str:
    """`auto`: `vllm` where the CPU build of vLLM is installed (the fastest measured on the `rg-cpu` round: 9.9x
    transformers' generate, against 2.0x for the rollout copy), else `rollout`; any other name as it is."""
    if how != "auto":
        return how
    from llm_backends.vllm_server import is_cpu_build, vllm_available

    return "vllm" if vllm_available() and is_cpu_build() else "rollout"


def chat_texts(tok, prompts: list[list[dict]], enable_thinking: bool | None = None) -> list[str]:
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False, **kwargs) for m in prompts]


def _generation_config(model, tok, *, n: int, temperature: float, max_new_tokens: int):
    import copy

    gen = copy.deepcopy(model.generation_config)
    gen.max_new_tokens = max_new_tokens
    gen.max_length = None
    gen.pad_token_id = tok.pad_token_id
    gen.num_return_sequences = n
    if temperature > 0:
        gen.do_sample, gen.temperature, gen.top_p, gen.top_k = True, temperature, 1.0, 0
    else:
        gen.do_sample, gen.temperature, gen.top_p, gen.top_k = False, None, None, None
    return gen


def generate_answers(model, tok, texts: list[str], *, n: int, temperature: float, max_new_tokens: int,
                     rows: int = 0, bf16: bool = False) -> list[list[str]]:
    """`n` answers to each prompt text by `model.generate` (sampled at `temperature`, greedy at 0), left-padded
    batches of at most `rows` answers (0: every prompt in one batch); `bf16`: under bf16 autocast."""
    import torch

    per = max(1, rows // n) if rows else len(texts)
    side = tok.padding_side
    tok.padding_side = "left"
    flat: list[str] = []
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(texts), per):
            enc = tok(texts[i:i + per], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model.generate(**enc, generation_config=_generation_config(
                    model, tok, n=n, temperature=temperature, max_new_tokens=max_new_tokens))
            flat += [tok.decode(ids, skip_special_tokens=True) for ids in out[:, enc["input_ids"].shape[1]:]]
    finally:
        tok.padding_side = side
        model.train(was_training)
    return [flat[i * n:(i + 1) * n] for i in range(len(texts))]


class FilteredSampler:
    """`n` answers to each of a round's prompts, by `how` (one of `SAMPLERS`, see the module docstring).

    Args:
        how: `rollout`, `vllm`, `generate` or `auto` (`resolve_sampler`).
        dtype: the rollout copy's or the vLLM server's weights: `auto` (bfloat16 on a CPU that multiplies bf16 in
            hardware, float32 elsewhere), `bfloat16` or `float32`.
        rows: answers per `generate` call (0: the whole round at once); the in-process samplers only.
        bf16: `generate` only: under bf16 autocast.
        log_dir: the vLLM server's log folder (default: a scratch folder, removed on `close`).

    `sync_seconds` adds up the time spent moving the trained weights to the sampler after a step (copy, or save and
    reload), `syncs` counts them; `start_seconds` is the once-a-stage cost of the first call (the rollout copy made,
    or the weights saved and the vLLM server started). Call `close()` (or use it as a context
    manager) to stop a vLLM server and remove its scratch folder; the in-process samplers hold nothing to close.
    """

    def __init__(self, how: str = DEFAULT_SAMPLER, *, dtype: str = "auto", rows: int = 0, bf16: bool = False,
                 log_dir: str | Path | None = None):
        if how not in CHOICES:
            raise ValueError(f"filtered sampler {how!r}: allowed: {', '.join(CHOICES)}")
        how = resolve_sampler(how)
        if dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"sampler dtype {dtype!r}: allowed: auto, bfloat16, float32")
        if rows < 0:
            raise ValueError(f"sampler rows={rows}: allowed: 0 (a round at once) or more")
        self.how, self.rows, self.bf16 = how, rows, bf16
        self.dtype = _resolve_dtype(dtype)
        self.log_dir = Path(log_dir) if log_dir else None
        self.sync_seconds, self.syncs, self.start_seconds = 0.0, 0, 0.0
        self._copy = None
        self._server = None
        self._scratch: Path | None = None
        self._version = None

    def __repr__(self) -> str:
        return f"FilteredSampler({self.how!r}, dtype={self.dtype!r})"

    @property
    def label(self) -> str:
        """What samples, in words: `rollout bfloat16`, `vllm bfloat16`, `generate float32` (or `+ bf16 autocast`)."""
        if self.how == "generate":
            return "generate float32" + (" + bf16 autocast" if self.bf16 else "")
        return f"{self.how} {self.dtype}"

    def __enter__(self) -> FilteredSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __call__(self, model, tok, prompts: list[list[dict]], *, n: int, temperature: float, max_new_tokens: int,
                 enable_thinking: bool | None = None, version: int = 0) -> list[list[str]]:
        """`n` answers to each chat prompt of `prompts` from `model` as it is at `version` (the optimiser step: the
        weights are synced to the sampler only when it moved since the last call); temperature 0: greedy."""
        if temperature <= 0 and n != 1:
            raise ValueError(f"greedy sampling with n={n}: allowed: n=1 at temperature 0")
        texts = chat_texts(tok, prompts, enable_thinking)
        if not texts:
            return []
        if self.how == "generate":
            return generate_answers(model, tok, texts, n=n, temperature=temperature, max_new_tokens=max_new_tokens,
                                    rows=self.rows, bf16=self.bf16)
        if self.how == "rollout":
            return generate_answers(self._synced_copy(model, version), tok, texts, n=n, temperature=temperature,
                                    max_new_tokens=max_new_tokens, rows=self.rows)
        self._sync_server(model, tok, version)
        return self._server_answers(tok, texts, n=n, temperature=temperature, max_new_tokens=max_new_tokens)

    # -- the rollout copy -------------------------------------------------------------------------

    def _synced_copy(self, model, version: int):
        from trainer.grpo_trainer import RolloutCopy

        t0 = time.perf_counter()
        if self._copy is None:
            self._copy = RolloutCopy(self.dtype)
        made, syncs = self._copy.model is None, self._copy.syncs
        copy = self._copy.synced(model, version)
        if made:
            self.start_seconds += time.perf_counter() - t0
        elif self._copy.syncs != syncs:
            self.sync_seconds += time.perf_counter() - t0
            self.syncs += 1
        return copy

    # -- the vLLM server --------------------------------------------------------------------------

    def _sync_server(self, model, tok, version: int) -> None:
        from llm_backends.vllm_server import VLLMServer

        if self._server is not None and version == self._version:
            return
        t0 = time.perf_counter()
        if self._scratch is None:
            shm = Path("/dev/shm")
            self._scratch = Path(tempfile.mkdtemp(prefix="filtered-sampler-", dir=shm if shm.is_dir() else None))
        weights = self._scratch / "weights"
        model.save_pretrained(str(weights))
        if self._server is None:
            tok.save_pretrained(str(weights))
            log_path = (self.log_dir or self._scratch) / "vllm-sampler.log"
            self._server = VLLMServer(weights, log_path=log_path, dtype=self.dtype, served_model_name="policy")
            self._server.start()
            self.start_seconds += time.perf_counter() - t0
        else:
            self._server.reload_weights(weights)
            self.sync_seconds += time.perf_counter() - t0
            self.syncs += 1
        self._version = version

    def _server_answers(self, tok, texts: list[str], *, n: int, temperature: float,
                        max_new_tokens: int) -> list[list[str]]:
        import httpx

        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        body = {"model": self._server.model_name, "prompt": ids, "n": n, "max_tokens": max_new_tokens,
                "temperature": max(0.0, temperature), "top_p": 1.0, "top_k": 0, "skip_special_tokens": True}
        r = httpx.post(f"{self._server.base_url}/completions", json=body, timeout=3600.0)
        if r.status_code >= 400:
            raise RuntimeError(f"vLLM /v1/completions failed: HTTP {r.status_code}: {r.text[:500]}")
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        if len(choices) != len(texts) * n:
            raise RuntimeError(f"vLLM answered {len(choices)} completions for {len(texts)} prompts x {n}")
        flat = [c["text"] for c in choices]
        return [flat[i * n:(i + 1) * n] for i in range(len(texts))]


def _resolve_dtype(dtype: str) -> str:
    if dtype != "auto":
        return dtype
    from llm_backends.vllm_server import cpu_has_bf16

    return "bfloat16" if cpu_has_bf16() else "float32"
