"""The peers: the same prompts through transformers' own generation, on the same weights.

* `hf-generate`: `model.generate` over fixed batches, left padded, the way a careful script
  uses it: prompts sorted by length first (so a batch pads little), results put back in input
  order, and the batch size the fastest of `HF_GENERATE_BATCH_SIZES` on a short probe unless
  one is given. `min_new_tokens = max_new_tokens` keeps it from stopping at an
  end-of-sequence token, so it does the same work as our engine with `ignore_eos`.
* `hf-generate-batch`: `model.generate_batch`, transformers' continuous batching with its
  paged cache and prefix sharing. Its automatic sizing targets GPUs: on a CPU it takes 90%
  of system RAM and an 8192-token step, and spends most of a short run filling static
  tensors. So it gets our engine's sizes instead: the same page size, as many cache blocks
  as our pool has pages (the same KV memory), our per-step token budget and sequence cap.
  An `eos_token_id` of -1 is its documented "no end-of-sequence" setting.

Both run the model with transformers' SDPA attention; our engine switches the shared model
back to its paged attention when it starts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from astrai_batch.bench.config import HF_GENERATE, HF_GENERATE_BATCH, HF_GENERATE_BATCH_SIZES
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.rss import PeakRss
from astrai_batch.bench.runs import SystemRun, check_generated, compact_json
from astrai_batch.engine import EngineConfig, LoadedModel
from astrai_batch.errors import AstraiBatchError

PEER_ATTENTION = "sdpa"
PROBE_MAX_TOKENS = 4


@dataclass(frozen=True)
class BatchSizeChoice:
    """The hf-generate batch size and how it was chosen, recorded with its runs."""

    batch_size: int
    probed: dict[int, float] | None = None  # size -> generated tokens/s on the probe; None: given

    def to_dict(self) -> dict[str, object]:
        if self.probed is None:
            return {"batch_size": self.batch_size, "batch_size_from": "given"}
        rates = {str(size): round(rate, 3) for size, rate in self.probed.items()}
        return {"batch_size": self.batch_size, "batch_size_from": "probe", "probe": rates}


def choose_hf_batch_size(loaded: LoadedModel, prompts: BenchPrompts) -> BatchSizeChoice:
    """The fastest of `HF_GENERATE_BATCH_SIZES` (those the prompt set can fill) on a probe.

    Each size generates `PROBE_MAX_TOKENS` tokens for one batch of that many prompts, taken
    from the middle of the length-sorted prompt set, and is scored in generated tokens per
    second; a prompt set smaller than every size probes one batch of all of it.
    """
    sizes = [size for size in HF_GENERATE_BATCH_SIZES if size <= prompts.num_prompts]
    sizes = sizes or [prompts.num_prompts]
    order = sorted(range(prompts.num_prompts), key=lambda i: len(prompts.prompt_token_ids[i]))
    rates = {}
    for size in sizes:
        start = (len(order) - size) // 2
        batch = [prompts.prompt_token_ids[i] for i in order[start : start + size]]
        seconds, _ = _generate_batches(loaded, [batch], PROBE_MAX_TOKENS)
        rates[size] = size * PROBE_MAX_TOKENS / seconds
    return BatchSizeChoice(max(rates, key=rates.__getitem__), rates)


def run_hf_generate(
    loaded: LoadedModel, prompts: BenchPrompts, choice: BatchSizeChoice, repeat: int | None
) -> SystemRun:
    size = choice.batch_size
    ids = prompts.prompt_token_ids
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [[ids[i] for i in order[start : start + size]] for start in range(0, len(ids), size)]
    with PeakRss() as rss:
        wall, sorted_lengths = _generate_batches(loaded, batches, prompts.max_tokens)
    lengths = [0] * len(ids)
    for index, length in zip(order, sorted_lengths, strict=True):
        lengths[index] = length  # back in input order, so a short prompt is named by its index
    return SystemRun(
        system=HF_GENERATE,
        repeat=repeat,
        wall_seconds=wall,
        prompt_tokens=prompts.prompt_tokens,
        generated_tokens=check_generated(HF_GENERATE, lengths, prompts.max_tokens),
        peak_rss_bytes=rss.peak_bytes,
        system_config=compact_json({**choice.to_dict(), "order": "by length", "padding": "left"}),
    )


def _generate_batches(
    loaded: LoadedModel, batches: Sequence[Sequence[Sequence[int]]], max_tokens: int
) -> tuple[float, list[int]]:
    """Seconds for `generate` over the batches, and each prompt's generated length in order."""
    model = loaded.model
    model.set_attn_implementation(PEER_ATTENTION)
    pad_id = _pad_token_id(loaded)
    generation = GenerationConfig(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad_id
    )
    lengths: list[int] = []
    started = time.perf_counter()
    for batch in batches:
        input_ids, attention_mask = _left_padded(batch, pad_id, model.device)
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=generation
            )
        lengths += [output.shape[1] - input_ids.shape[1]] * len(batch)
    _synchronize(model.device)  # on CUDA the last kernels may still be queued
    return time.perf_counter() - started, lengths


def run_hf_generate_batch(
    loaded: LoadedModel,
    prompts: BenchPrompts,
    engine: EngineConfig,
    kv_pages: int,
    repeat: int | None,
) -> SystemRun:
    """`kv_pages`: how many pages our engine's pool holds, to give it the same KV memory."""
    model = loaded.model
    model.set_attn_implementation(PEER_ATTENTION)
    sizes = {
        "page_size": engine.page_size,
        "num_blocks": kv_pages,
        "max_batch_tokens": engine.max_num_batched_tokens,
        "max_requests_per_batch": engine.max_num_seqs,
    }
    generation = GenerationConfig(
        max_new_tokens=prompts.max_tokens, do_sample=False, eos_token_id=-1
    )
    inputs = [list(ids) for ids in prompts.prompt_token_ids]
    with PeakRss() as rss:
        started = time.perf_counter()
        outputs = model.generate_batch(
            inputs=inputs,
            generation_config=generation,
            continuous_batching_config=ContinuousBatchingConfig(**sizes),
            progress_bar=False,
            # Its warm-up captures CUDA graphs; there are none to capture on a CPU.
            warmup=model.device.type == "cuda",
        )
        _synchronize(model.device)
        wall = time.perf_counter() - started
    results = list(outputs.values())
    failed = [output for output in results if output.error is not None]
    if failed or len(results) != len(inputs):
        first = failed[0].error if failed else "missing results"
        raise AstraiBatchError(
            f"{HF_GENERATE_BATCH}: {len(inputs) - len(results) + len(failed)} of {len(inputs)} "
            f"prompts failed, first: {first}"
        )
    lengths = [len(output.generated_tokens) for output in results]
    return SystemRun(
        system=HF_GENERATE_BATCH,
        repeat=repeat,
        wall_seconds=wall,
        prompt_tokens=prompts.prompt_tokens,
        generated_tokens=check_generated(HF_GENERATE_BATCH, lengths, prompts.max_tokens),
        peak_rss_bytes=rss.peak_bytes,
        system_config=compact_json(sizes),
    )


def _pad_token_id(loaded: LoadedModel) -> int:
    """Padding never reaches attention (the mask hides it), so any real token id does."""
    tokenizer = loaded.tokenizer
    for candidate in (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        *sorted(loaded.eos_token_ids),
    ):
        if candidate is not None:
            return int(candidate)
    return 0


def _left_padded(
    batch: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
