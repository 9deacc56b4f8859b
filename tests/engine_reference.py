"""Shared pieces of the engine tests: prompt sets and the transformers reference."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import torch


def mixed_prompts(vocab_size: int, *, count: int = 16, seed: int = 0, shared: bool = False):
    """`count` prompts of mixed lengths (3 to ~150 tokens) from ordinary (non-special) ids.

    With `shared`, prompts are built from 3 common prefixes of 40-70 tokens (some prompts are
    exact prefixes of others, some share only part of a page), so the prefix cache is hit hard.
    """
    rng = random.Random(seed)
    low = 3  # the tiny tokenizer's special tokens are ids 0-2
    prefixes = [
        [rng.randrange(low, vocab_size) for _ in range(rng.randint(40, 70))] for _ in range(3)
    ]
    prompts = []
    for i in range(count):
        if shared:
            base = list(prefixes[i % 3])
            if i % 5 == 4:
                base = base[: rng.randint(10, len(base))]
            tail = [rng.randrange(low, vocab_size) for _ in range(rng.randint(1, 40))]
            prompts.append(base + tail)
        else:
            length = rng.choice([3, 7, 15, 16, 17, 31, 33, 64, 90, 150])
            prompts.append([rng.randrange(low, vocab_size) for _ in range(length)])
    return prompts


@cache
def _reference_model(model_dir: str, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.eval()
    return model


def hf_greedy(
    model_dir: Path,
    prompts,
    max_new_tokens: int,
    logits_processors=None,
    min_new_tokens=0,
    dtype: torch.dtype = torch.float32,
) -> list[list[int]]:
    """transformers `generate`, one prompt at a time, no padding, greedy, in `dtype`.

    `logits_processors(i)`, when given, returns the (single-use) processors of prompt i;
    `min_new_tokens` masks the model's EOS ids until that many tokens were generated.
    """
    model = _reference_model(str(model_dir), dtype)
    outputs = []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            extra = {} if logits_processors is None else {"logits_processor": logits_processors(i)}
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=min_new_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
                **extra,
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def hf_greedy_with_margins(model_dir: Path, prompts, max_new_tokens: int, dtype: torch.dtype):
    """transformers `generate` as `hf_greedy`, with each generated position's top-2 logits
    (what a near-tie is judged by)."""
    model = _reference_model(str(model_dir), dtype)
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            top2 = [tuple(score[0].float().topk(2).values.tolist()) for score in out.scores]
            outputs.append((out.sequences[0, len(prompt) :].tolist(), top2))
    return outputs


def bf16_near_tie(first: float, second: float, ulps: int = 2) -> bool:
    """Whether two logits are within `ulps` bfloat16 steps at their size: a near-tie, which
    summing the same products in another (equally valid) order can flip."""
    step = 2.0 ** (torch.tensor(abs(first) or 1.0).log2().floor().item() - 7)
    return first - second <= ulps * step


def make_sequence(
    seq_id: int,
    tokens: list[int],
    *,
    page_size: int,
    max_tokens: int = 8,
    arrival: int | None = None,
):
    """A greedy engine `Sequence` over `tokens` (request id = seq_id), for scheduler tests."""
    from astrai_batch.engine.sampling.params import SamplingParams
    from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler
    from astrai_batch.engine.sequences.sequence import Sequence

    params = SamplingParams(max_tokens=max_tokens)
    return Sequence(
        seq_id=seq_id,
        request_id=seq_id,
        sample_index=0,
        prompt_token_ids=tuple(tokens),
        params=params,
        sampler=SequenceSampler(params, tokens),
        arrival=seq_id if arrival is None else arrival,
        page_size=page_size,
    )
