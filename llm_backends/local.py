"""LocalEngine: the chat interface on an in-process transformers model (used where vLLM is absent).

Prompts go through the tokenizer's chat template, are left-padded and generated in batches (greedy at
``temperature=0``, sampled otherwise). A folder holding a LoRA adapter (``adapter_config.json``) is loaded
on its base model and merged; the base is chosen as everywhere else (:func:`llm_backends.checkpoints.adapter_base`):
the one the checkpoint names when it resolves, else ``base_model``. ``json_schema`` cannot be enforced here: the
schema is written into the prompt and the first JSON value of the answer is returned as ``ChatResult.parsed``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from llm_backends.base import ChatModel, ChatResult, Messages, UsageStats, extract_json, with_schema_in_prompt

log = logging.getLogger(__name__)


class LocalEngine(ChatModel):
    """A :class:`~llm_backends.base.ChatModel` running ``model_path`` in this process.

    Args:
        model_path: a folder with full weights or a LoRA adapter, a short name or a Hugging Face id
            (resolved with :func:`llm_backends.models.resolve_model`).
        batch_size: prompts generated together at most.
        dtype: torch dtype name for the weights (``float32`` matches vLLM ``--dtype float32``).
        device: torch device; ``None`` picks CUDA when available, else CPU.
        seed: torch seed used before each sampled batch, for reproducible sampling.
        base_model: base for a LoRA adapter whose config names none that resolves (e.g. a path on the
            machine that trained it); ignored for full weights.
        prompt_cache: keep the keys and values of the last prompt sent alone, and reuse them when the same prompt
            comes again: an engineer whose reply was cut is asked again with the same prompt and a larger limit,
            and on CPU the prompt's forward is most of a call (``python -m evals.bench.bench_reask``).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        batch_size: int = 8,
        dtype: str = "float32",
        device: str | None = None,
        seed: int | None = None,
        base_model: str | os.PathLike | None = None,
        chat_template_kwargs: dict | None = None,
        prompt_cache: bool = True,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from llm_backends.checkpoints import adapter_base, adapter_config
        from llm_backends.models import resolve_model

        path = resolve_model(model_path)
        self.model_path = path
        self.batch_size = max(1, int(batch_size))
        self.seed = seed
        self.chat_template_kwargs = dict(chat_template_kwargs or {})  # e.g. {"enable_thinking": False} (Qwen3)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = getattr(torch, dtype)
        if adapter_config(path) is not None:
            base = adapter_base(path, base_model)
            from peft import PeftModel

            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
            model = PeftModel.from_pretrained(model, path).merge_and_unload()
            tok_dir = path if (path / "tokenizer_config.json").exists() else base
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
            tok_dir = path
        self.model = model.to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model_name = path.name
        self.stats = UsageStats()
        self._lock = threading.Lock()  # one generate at a time: torch already uses every core
        self.prompt_cache = prompt_cache
        self._cached: tuple | None = None  # (a prompt's token ids, the cache of all of them but the last)

    def __repr__(self) -> str:
        return f"LocalEngine({str(self.model_path)!r}, device={self.device!r})"

    def chat_batch(
        self,
        batch: list[Messages],
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_schema: dict | None = None,
    ) -> list[ChatResult]:
        """Answers in input order. Prompts are sorted by length into batches so padding stays small."""
        if json_schema is not None:
            batch = [with_schema_in_prompt(m, json_schema) for m in batch]
        prompts = [self._render(m) for m in batch]
        lengths = [len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        results: list[ChatResult | None] = [None] * len(prompts)
        for k in range(0, len(order), self.batch_size):
            idx = order[k : k + self.batch_size]
            for i, r in zip(idx, self._generate([prompts[i] for i in idx], max_tokens, temperature), strict=True):
                if json_schema is not None:
                    r = ChatResult(**{**r.__dict__, "parsed": extract_json(r.text)})
                results[i] = r
                self.stats.add(r)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Frees the weights (the object is unusable afterwards)."""
        self.model = None
        self._cached = None
        import gc

        gc.collect()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _render(self, messages: Messages) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      **self.chat_template_kwargs)
        # a base model without a template: plain "role: content" lines
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"

    def _generate(self, prompts: list[str], max_tokens: int, temperature: float) -> list[ChatResult]:
        import torch

        if self.model is None:
            raise RuntimeError("LocalEngine is closed")
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        kw: dict = dict(max_new_tokens=max_tokens, pad_token_id=self.tokenizer.pad_token_id)
        if temperature and temperature > 0:
            kw.update(do_sample=True, temperature=float(temperature), top_p=1.0, top_k=0)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with self._lock, torch.inference_mode():
            if self.seed is not None and kw["do_sample"]:
                torch.manual_seed(self.seed)
            t0 = time.monotonic()
            if self.prompt_cache and len(prompts) == 1 and enc["input_ids"].shape[1] > 1:
                kw["past_key_values"] = self._prompt_kv(enc["input_ids"])
            out = self.model.generate(**enc, **kw)
            elapsed = time.monotonic() - t0
        new = out[:, enc["input_ids"].shape[1] :]
        eos = set(_as_list(self.model.generation_config.eos_token_id)) | {self.tokenizer.eos_token_id}
        results = []
        for row, mask in zip(new.tolist(), enc["attention_mask"].tolist(), strict=True):
            n = 0
            finish = "length"
            for t in row:
                n += 1
                if t in eos:
                    finish = "stop"
                    break
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True)
            results.append(
                ChatResult(
                    text=text,
                    latency_s=elapsed,
                    prompt_tokens=int(sum(mask)),
                    completion_tokens=n,
                    model=self.model_name,
                    finish_reason=finish,
                )
            )
        return results

    def _prompt_kv(self, ids):
        """A copy of the keys and values of `ids` but its last token (generate runs that one and continues), from
        the kept ones when the prompt is the one sent before; computed and kept otherwise. Every prompt sent alone
        takes this path, so an answer is the same whether its prompt was cached or not."""
        import copy

        import torch

        if self._cached is None or not torch.equal(self._cached[0], ids):
            self._cached = None  # the old one's memory goes first
            out = self.model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1)  # no vocabulary rows
            self._cached = (ids.clone(), out.past_key_values)
        return copy.deepcopy(self._cached[1])


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, list | tuple) else [x]

