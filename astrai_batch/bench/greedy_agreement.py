"""Greedy tokens from our engine and from transformers `generate` on the same loaded model,
and how far they agree: the device check's exactness figures.

transformers stops at end of sequence, ours ignores it: ours is compared on the length
transformers produced. Rounding (bfloat16) can flip a near-tie, after which the continuations
differ, so both the share of agreeing tokens and of agreeing leading tokens are reported.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.types import GenerationRequest

GIB = 1024**3


def agreement(prompts: list[list[int]], ours: list[list[int]], theirs: list[list[int]]) -> dict:
    rows = []
    for prompt, mine, reference in zip(prompts, ours, theirs, strict=True):
        mine = mine[: len(reference)]
        same = sum(a == b for a, b in zip(mine, reference, strict=True))
        lead = next(
            (i for i, (a, b) in enumerate(zip(mine, reference, strict=True)) if a != b), len(mine)
        )
        rows.append(
            {
                "prompt_tokens": len(prompt),
                "compared": len(reference),
                "agree": same,
                "leading_agree": lead,
            }
        )
    compared = sum(r["compared"] for r in rows)
    return {
        "rows": len(rows),
        "exact_rows": sum(r["agree"] == r["compared"] for r in rows),
        "token_agreement": sum(r["agree"] for r in rows) / compared,
        "leading_agreement": sum(r["leading_agree"] for r in rows) / compared,
        "per_row": rows,
    }


def engine_greedy(
    loaded: LoadedModel,
    prompts: list[list[int]],
    max_tokens: int,
    config: EngineConfig | None = None,
):
    if config is None:
        config = EngineConfig(max_num_seqs=len(prompts), kv_cache_memory=GIB // 4)
    core = EngineCore(loaded, config)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        errors = core.add_request(GenerationRequest(index, prompt, params))
        if errors:
            raise RuntimeError(errors[0].error)
    outputs: dict[int, list[int]] = {}
    while core.num_unfinished:
        for result in core.step():
            outputs[result.request_id] = list(result.token_ids)
    core.check_invariants()
    return [outputs[i] for i in range(len(prompts))]


def hf_greedy(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int):
    from transformers import GenerationConfig

    model = loaded.model
    model.set_attn_implementation("sdpa")
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=loaded.tokenizer.pad_token_id,
        eos_token_id=-1,  # no id: end of sequence ends nothing, as ours ignores it
    )
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=model.device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs
