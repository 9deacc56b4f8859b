"""The model runner: one forward pass over a packed, ragged batch of scheduled work.

It owns the model's forward and the paged KV pool's tensors, and nothing about scheduling:
the scheduler hands it `ScheduledChunk`s (which tokens of which sequence to compute, at what
positions, into which pages) and gets back the next-token logits of the chunks that end at
their sequence's last known token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from astrai_batch.cache.storage import KVPool
from astrai_batch.engine.attention import (
    ATTENTION_NAME,
    BATCH_KWARG,
    AttentionBatch,
    DecodeGroup,
    PrefillSpan,
    offset_causal_mask,
    register_paged_attention,
)


@dataclass(frozen=True)
class ScheduledChunk:
    """Compute `token_ids` at positions [start, start + len) of one sequence."""

    token_ids: Sequence[int]
    start: int
    pages: Sequence[int]  # the sequence's page table, covering at least start + len tokens
    wants_logits: bool  # the chunk ends at the sequence's last known token


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [number of chunks with wants_logits, vocab], float32
    forward_seconds: float


class ModelRunner:
    def __init__(self, model: torch.nn.Module, pool: KVPool) -> None:
        register_paged_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        self.model = model
        self.pool = pool
        self.device = pool.key_cache[0].device
        self.page_size = pool.page_size

    @torch.inference_mode()
    def forward(self, chunks: Sequence[ScheduledChunk]) -> ForwardOutput:
        if not chunks:
            raise ValueError("forward needs at least one chunk")
        batch, input_ids, positions, logit_rows = self._build_batch(chunks)
        started = time.perf_counter()
        outputs = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            use_cache=False,
            logits_to_keep=logit_rows,
            **{BATCH_KWARG: batch},
        )
        logits = outputs.logits[0].float()
        return ForwardOutput(logits=logits, forward_seconds=time.perf_counter() - started)

    def _build_batch(self, chunks: Sequence[ScheduledChunk]):
        device = self.device
        page = self.page_size
        token_ids: list[int] = []
        positions: list[int] = []
        write_slots: list[torch.Tensor] = []
        logit_rows: list[int] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lengths: list[int] = []
        prefills: list[PrefillSpan] = []
        for chunk in chunks:
            n = len(chunk.token_ids)
            if n == 0:
                raise ValueError("a scheduled chunk has no tokens")
            end = chunk.start + n
            if len(chunk.pages) * page < end:
                raise ValueError(
                    f"chunk ends at token {end} but its {len(chunk.pages)} pages "
                    f"hold {len(chunk.pages) * page}"
                )
            row = len(token_ids)
            token_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, end))
            table = torch.tensor(chunk.pages[: (end + page - 1) // page], dtype=torch.long)
            write_slots.append(self.pool.slot_indices(table, torch.arange(chunk.start, end)))
            if chunk.wants_logits:
                logit_rows.append(row + n - 1)
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(list(chunk.pages[: (end + page - 1) // page]))
                decode_lengths.append(end)
            elif chunk.start == 0:
                prefills.append(PrefillSpan(row, row + n, 0, None, None))
            else:
                mask = offset_causal_mask(n, end, device)
                prefills.append(PrefillSpan(row, row + n, chunk.start, table.to(device), mask))
        decode = None
        if decode_rows:
            max_pages = max(len(t) for t in decode_tables)
            tables = torch.zeros(len(decode_tables), max_pages, dtype=torch.long)
            for i, t in enumerate(decode_tables):
                tables[i, : len(t)] = torch.tensor(t, dtype=torch.long)
            lengths = torch.tensor(decode_lengths, dtype=torch.long)
            max_len = max_pages * page
            key_mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
            decode = DecodeGroup(
                token_index=torch.tensor(decode_rows, dtype=torch.long, device=device),
                page_tables=tables.to(device),
                key_mask=key_mask.view(len(decode_rows), 1, 1, max_len).to(device),
            )
        batch = AttentionBatch(
            key_cache=self.pool.key_cache,
            value_cache=self.pool.value_cache,
            page_size=page,
            write_slots=torch.cat(write_slots).to(device),
            decode=decode,
            prefills=prefills,
        )
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=device)
        position_ids = torch.tensor(positions, dtype=torch.long, device=device)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=device)
        return batch, input_ids, position_ids, rows
