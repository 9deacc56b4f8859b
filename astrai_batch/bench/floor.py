"""The `floor` line: how long the model forward alone takes for the workload's ideal work.

The ideal work is the workload's unique prefill tokens (its prefix tree at the page size)
plus one decode token per prompt per output token after the first (the first comes from the
prefill's logits). Each is priced at the fastest per-token time measured over a few chunk
sizes and decode batch sizes (each size timed as the fastest of a few forwards), so the line
is what this machine allows with this model whatever the engine's scheduling does.

Timings come from our own `ModelRunner.forward` and its `forward_seconds` (the same
measure as the engine's `forward_seconds`: CUDA events on a GPU, so queued kernels count),
over a private KV pool: the model with the paged attention, the LM head on the rows that
need logits, no scheduling and no sampling.
Two simplifications: prefill chunks are timed from position 0 (the workload's unique
suffixes really attend to a cached prefix, a small extra at these lengths), and every
decode sequence has the same context, the workload's mean prompt length plus half the
output.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from astrai_batch.bench.config import FLOOR
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.runs import SystemRun
from astrai_batch.cache import KVPool
from astrai_batch.engine import LoadedModel
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk

PREFILL_CHUNKS = (128, 256, 512, 1024)
DECODE_BATCHES = (16, 32, 64, 128, 256)
TIMED_FORWARDS = 3


@dataclass(frozen=True)
class Floor:
    prefill_tokens: int  # the workload's ideal prefill
    decode_tokens: int  # forward tokens of the decode steps
    prefill_chunk: int  # the fastest chunk size per token
    prefill_seconds_per_token: float
    decode_batch: int  # the fastest decode batch size per token
    decode_seconds_per_token: float
    decode_context: int

    @property
    def seconds(self) -> float:
        return (
            self.prefill_tokens * self.prefill_seconds_per_token
            + self.decode_tokens * self.decode_seconds_per_token
        )

    def as_run(self, prompts: BenchPrompts) -> SystemRun:
        """The floor as a results row: its wall time is the priced ideal work."""
        details = {
            "prefill_chunk": self.prefill_chunk,
            "prefill_seconds_per_token": self.prefill_seconds_per_token,
            "decode_batch": self.decode_batch,
            "decode_seconds_per_token": self.decode_seconds_per_token,
            "decode_context": self.decode_context,
            "decode_tokens": self.decode_tokens,
        }
        return SystemRun(
            system=FLOOR,
            repeat=None,
            wall_seconds=self.seconds,
            prompt_tokens=prompts.prompt_tokens,
            generated_tokens=prompts.generated_tokens,
            peak_rss_bytes=None,
            system_config=json.dumps(details, sort_keys=True, separators=(",", ":")),
        )


def measure_floor(
    loaded: LoadedModel, prompts: BenchPrompts, page_size: int, numerics: str = "invariant"
) -> Floor:
    limit = loaded.max_model_len
    # A chunk longer than the whole ideal prefill is never needed, so it is not timed.
    useful = max(PREFILL_CHUNKS[0], prompts.ideal.unique_tokens)
    chunks = [size for size in PREFILL_CHUNKS if size <= min(limit, useful)] or [limit]
    batches = [size for size in DECODE_BATCHES if size <= prompts.num_prompts]
    batches = batches or [prompts.num_prompts]
    mean_prompt = prompts.prompt_tokens // prompts.num_prompts
    context = max(1, min(limit, mean_prompt + prompts.max_tokens // 2))
    context_pages = -(-context // page_size)
    num_pages = max(-(-max(chunks) // page_size), context_pages - 1 + max(batches))
    param = next(loaded.model.parameters())
    pool = KVPool(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        page_size=page_size,
        num_pages=num_pages,
        dtype=param.dtype,
        device=param.device,
        latent=loaded.kv_latent,
    )
    runner = ModelRunner(loaded.model, pool, numerics=numerics)
    filler = _filler_tokens(prompts.prompt_token_ids[0], max(max(chunks), max(batches)))
    prefill = {size: _prefill_seconds(runner, filler[:size], page_size) / size for size in chunks}
    decode = {
        size: _decode_seconds(runner, filler[:size], context, context_pages) / size
        for size in batches
    }
    best_chunk = min(prefill, key=prefill.__getitem__)
    best_batch = min(decode, key=decode.__getitem__)
    return Floor(
        prefill_tokens=prompts.ideal.unique_tokens,
        decode_tokens=prompts.num_prompts * (prompts.max_tokens - 1),
        prefill_chunk=best_chunk,
        prefill_seconds_per_token=prefill[best_chunk],
        decode_batch=best_batch,
        decode_seconds_per_token=decode[best_batch],
        decode_context=context,
    )


def _prefill_seconds(runner: ModelRunner, tokens: Sequence[int], page_size: int) -> float:
    pages = list(range(-(-len(tokens) // page_size)))
    chunk = ScheduledChunk(token_ids=tokens, start=0, pages=pages, wants_logits=True)
    return _fastest_forward(runner, [chunk])


def _decode_seconds(
    runner: ModelRunner, tokens: Sequence[int], context: int, context_pages: int
) -> float:
    # The sequences share every page but their last, which each writes its new token to.
    shared = list(range(context_pages - 1))
    chunks = [
        ScheduledChunk(
            token_ids=[token],
            start=context - 1,
            pages=[*shared, len(shared) + index],
            wants_logits=True,
        )
        for index, token in enumerate(tokens)
    ]
    return _fastest_forward(runner, chunks)


def _fastest_forward(runner: ModelRunner, chunks: list[ScheduledChunk]) -> float:
    # The fastest of a few: interference from other work on the machine only ever adds time,
    # and the floor is what the hardware can do.
    runner.forward(chunks)  # warm: first calls at a new shape allocate
    return min(runner.forward(chunks).forward_seconds for _ in range(TIMED_FORWARDS))


def _filler_tokens(prompt: Sequence[int], count: int) -> list[int]:
    """`count` real token ids (the compute does not depend on which)."""
    repeats = -(-count // len(prompt))
    return (list(prompt) * repeats)[:count]
