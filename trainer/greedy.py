"""Greedy answers of a model to a task's items, verified by the task: a small in-process check for the SFT warm
start's curve, tests and benchmarks (the run's own evaluation is `nodes.evaluate`, served by vLLM where it can)."""

from __future__ import annotations

from collections import Counter

from trainer.task import Task, load_task


def greedy_valid_rate(
    model, tokenizer, instances: list, *, task: str | Task, max_new_tokens: int = 128, batch_size: int = 8,
    prompt_style: str = "full", sampler=None, **generate_kwargs,
) -> dict:
    """Greedy answers of `model` to `instances`, verified by the task: {valid_rate, optimal_rate, n, failures,
    by_level, sample, valid, answers} (`by_level`: valid rate per level, MAPF: per grid size; `sample`: the first answer, for a look at what
    fails; `valid`: each instance's verdict, in order, for paired comparisons; `answers`: each instance's
    {id, answer, failure}, in order). `generate_kwargs` go to `model.generate` (e.g. a `logits_processor`).
    `sampler`: a `trainer.filtered_sampling.FilteredSampler` that answers instead of `model.generate` (the benches'
    fast path: GRPO's bf16 rollout copy); it takes no `generate_kwargs`.

    A small in-process check for tests and benchmarks (the run's own evaluation is `nodes.evaluate`).
    """
    import torch

    task = load_task(task)
    if sampler is not None:
        if generate_kwargs:
            raise ValueError(f"greedy_valid_rate with a sampler takes no generate arguments, got {sorted(generate_kwargs)}")
        texts = []
        for i in range(0, len(instances), batch_size):
            texts += [a[0] for a in sampler(model, tokenizer, [task.prompt(x, prompt_style)
                                                               for x in instances[i:i + batch_size]],
                                            n=1, temperature=0, max_new_tokens=max_new_tokens)]
        return score_texts(instances, texts, task)
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    texts: list[str] = []
    try:
        for i in range(0, len(instances), batch_size):
            chunk = instances[i : i + batch_size]
            prompts = [tokenizer.apply_chat_template(task.prompt(x, prompt_style),
                                                     add_generation_prompt=True, tokenize=False) for x in chunk]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id, **generate_kwargs)
            texts += [tokenizer.decode(ids, skip_special_tokens=True) for ids in out[:, enc["input_ids"].shape[1] :]]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return score_texts(instances, texts, task)


def score_texts(instances: list, texts: list[str], task: str | Task) -> dict:
    """`greedy_valid_rate`'s figures for given answers (`texts[i]` answers `instances[i]`), each verified by the
    task (MAPF: `env.verify` on the makespan): so answers kept from an earlier run are scored again, never trusted."""
    task = load_task(task)
    if len(texts) != len(instances):
        raise ValueError(f"{len(texts)} answers for {len(instances)} instances; allowed: one answer per instance")
    verdicts = [task.verify(inst, text) for inst, text in zip(instances, texts, strict=True)]
    each = [bool(v.valid) for v in verdicts]
    per_size: dict[int, list[int]] = {}
    for inst, ok in zip(instances, each, strict=True):
        per_size.setdefault(task.level(inst), []).append(int(ok))
    n = max(1, len(instances))
    return {"valid_rate": sum(each) / n, "optimal_rate": sum(bool(v.optimal) for v in verdicts) / n,
            "n": len(instances), "failures": dict(Counter(v.label for v in verdicts if v.label)),
            "by_level": {s: round(sum(v) / len(v), 4) for s, v in sorted(per_size.items())},
            "sample": texts[0] if texts else None, "valid": each,
            "answers": [{"id": task.item_id(i), "answer": t, "failure": v.label}
                        for i, t, v in zip(instances, texts, verdicts, strict=True)]}


def sampled_valid_rate(
    model, tokenizer, instances: list, *, sampler, k: int, temperature: float, max_new_tokens: int = 128,
    batch_size: int = 8, prompt_style: str = "full", task: str | Task,
) -> dict:
    """mean@k: `k` answers of `model` to each of `instances` sampled at `temperature` by `sampler` (a
    `trainer.filtered_sampling.FilteredSampler`, or any callable of its signature), each verified by the task.

    Returns {mean_at_k, k, temperature, n, by_level, valid_counts}: the share of the n x k answers that are valid, the
    same per level, and each instance's count of valid answers (0..k, in order: for intervals over questions)."""
    if k < 1 or temperature <= 0:
        raise ValueError(f"mean@k with k={k}, temperature={temperature}: allowed: k >= 1 and a temperature above 0")
    task = load_task(task)
    counts: list[int] = []
    for i in range(0, len(instances), batch_size):
        chunk = instances[i:i + batch_size]
        answers = sampler(model, tokenizer, [task.prompt(x, prompt_style) for x in chunk], n=k,
                          temperature=temperature, max_new_tokens=max_new_tokens)
        if len(answers) != len(chunk) or any(len(a) != k for a in answers):
            raise ValueError(f"the sampler gave {[len(a) for a in answers]} answers for {len(chunk)} questions x {k}")
        counts += [sum(bool(task.verify(x, t).valid) for t in outs) for x, outs in zip(chunk, answers, strict=True)]
    per_size: dict[int, list[int]] = {}
    for inst, c in zip(instances, counts, strict=True):
        per_size.setdefault(task.level(inst), []).append(c)
    return {"mean_at_k": sum(counts) / max(1, k * len(instances)), "k": k, "temperature": temperature,
            "n": len(instances), "by_level": {s: round(sum(v) / (k * len(v)), 4) for s, v in sorted(per_size.items())},
            "valid_counts": counts}
