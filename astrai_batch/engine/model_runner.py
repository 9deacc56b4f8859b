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

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention import (
    ATTENTION_NAME,
    BATCH_KWARG,
    AttentionBatch,
    DecodeGroup,
    PrefillSpan,
    offset_causal_mask,
    register_paged_attention,
)
from astrai_batch.engine.cascade import DecodePartition, partition_decodes
from astrai_batch.engine.cascade_plan import CascadeBatch, padded_tables, plan_cascade
from astrai_batch.engine.page_gather import PageGatherer


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
    def __init__(self, model: torch.nn.Module, pool: KVPool, *, use_cascade: bool = True) -> None:
        register_paged_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        self.model = model
        self.pool = pool
        self.device = pool.key_cache[0].device
        self.page_size = pool.page_size
        self.use_cascade = use_cascade
        self.gatherer = PageGatherer()

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
                decode_tables.append([int(p) for p in chunk.pages[: (end + page - 1) // page]])
                decode_lengths.append(end)
            elif chunk.start == 0:
                prefills.append(PrefillSpan(row, row + n, 0, None, None))
            else:
                mask = offset_causal_mask(n, end, device)
                prefills.append(PrefillSpan(row, row + n, chunk.start, table.to(device), mask))
        decode, cascade = self._decode_groups(decode_rows, decode_tables, decode_lengths)
        batch = AttentionBatch(
            key_cache=self.pool.key_cache,
            value_cache=self.pool.value_cache,
            page_size=page,
            write_slots=torch.cat(write_slots).to(device),
            longest_context=max(chunk.start + len(chunk.token_ids) for chunk in chunks),
            decode=decode,
            cascade=cascade,
            prefills=prefills,
            gatherer=self.gatherer,
        )
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=device)
        position_ids = torch.tensor(positions, dtype=torch.long, device=device)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=device)
        return batch, input_ids, position_ids, rows

    def _decode_groups(
        self, rows: list[int], tables: list[list[int]], lengths: list[int]
    ) -> tuple[DecodeGroup | None, CascadeBatch | None]:
        """Decodes sharing prefix pages go to the cascade batch; the rest one padded group."""
        if not rows:
            return None, None
        device = self.device
        page = self.page_size
        if self.use_cascade:
            partition = partition_decodes(tables, lengths, page)
        else:
            partition = DecodePartition(groups=[], rest=list(range(len(rows))))
        cascade = plan_cascade(partition.groups, rows, tables, lengths, page, device)
        if not partition.rest:
            return None, cascade
        rest_tables, key_mask = padded_tables(
            [tables[i] for i in partition.rest], [lengths[i] for i in partition.rest], page
        )
        decode = DecodeGroup(
            token_index=torch.tensor([rows[i] for i in partition.rest], device=device),
            page_tables=rest_tables.to(device),
            key_mask=key_mask.to(device),
        )
        return decode, cascade
