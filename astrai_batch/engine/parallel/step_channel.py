"""Rank 0's commands to the other ranks: a step's arrays, a new engine, stop.

Every command is a fixed header of 8 int64 (command and sizes) and, when it has one, a
payload: both broadcast from preallocated host buffers (the payload buffer grows, on every
rank alike, when a step is larger than any before). A step's payload is its `StepArrays`
packed end to end (token ids, positions, write slots, logit rows, chunk starts, token
counts, context starts, decode rows, the page-table matrix): the ranks rebuild the attention
plan from it exactly as rank 0 does, so rank 0's scheduler, cache manager and samplers have
no counterpart elsewhere. Two broadcasts of exactly the step's size cost less than one of a
buffer sized for the largest possible step (a page-table matrix of max_num_seqs x
max_model_len / page_size).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.parallel.rank_group import IDLE_WAIT_S, RankGroup

STOP, STEP, ENGINE = 0, 1, 2
_HEADER = 8


class StepChannel:
    def __init__(self, group: RankGroup) -> None:
        self._group = group
        self._header = torch.zeros(_HEADER, dtype=torch.int64)
        self._payload = torch.zeros(4096, dtype=torch.int64)

    # -- rank 0 ----------------------------------------------------------------------------

    def send_step(self, step: StepArrays) -> None:
        c, p = step.page_tables.shape
        t, n_logits, d = len(step.token_ids), len(step.logit_rows), len(step.decodes)
        size = 3 * t + n_logits + 3 * c + d + c * p
        payload = self._room(size).numpy()
        at = 0
        for part in (
            step.token_ids,
            step.positions,
            step.write_slots,
            step.logit_rows,
            step.token_start,
            step.num_tokens,
            step.context_start,
            step.decodes,
        ):
            payload[at : at + len(part)] = part
            at += len(part)
        payload[at:size] = step.page_tables.reshape(-1)
        self._send(STEP, t, n_logits, c, p, d, step.longest_context, size=size)

    def send_engine(self, settings: Any) -> None:
        """A new engine's settings (picklable); every rank assembles its own from them."""
        data = np.frombuffer(pickle.dumps(settings), dtype=np.uint8)
        size = -(-len(data) // 8)
        room = self._room(size)
        room.numpy().view(np.uint8)[: len(data)] = data
        self._send(ENGINE, len(data), size=size)

    def send_stop(self) -> None:
        self._send(STOP, size=0)

    def _send(self, command: int, *values: int, size: int) -> None:
        header = self._header
        header.zero_()
        header[0] = command
        header[1 : 1 + len(values)] = torch.tensor(values, dtype=torch.int64)
        header[_HEADER - 1] = size
        self._group.broadcast(header)
        if size:
            self._group.broadcast(self._payload[:size])

    # -- the other ranks -------------------------------------------------------------------

    def receive(self) -> tuple[int, Any]:
        """(STEP, StepArrays) | (ENGINE, settings) | (STOP, None). A step's arrays are views
        of the payload buffer: valid until the next `receive`."""
        header = self._header
        self._group.broadcast(header, wait_s=IDLE_WAIT_S)  # rank 0 may be busy elsewhere
        command, *values, size = header.tolist()
        if command == STOP:
            return STOP, None
        payload = self._room(size)
        self._group.broadcast(payload[:size])
        if command == ENGINE:
            raw = payload.numpy().view(np.uint8)[: values[0]].tobytes()
            return ENGINE, pickle.loads(raw)
        if command != STEP:
            raise ValueError(f"unknown tensor-parallel command {command}")
        t, n_logits, c, p, d, longest = values[:6]
        flat = payload.numpy()
        at = 0
        parts = []
        for length in (t, t, t, n_logits, c, c, c, d):
            parts.append(flat[at : at + length])
            at += length
        tables = flat[at : at + c * p].reshape(c, p)
        return STEP, StepArrays(
            *parts[:7], page_tables=tables, decodes=parts[7], longest_context=longest
        )

    def _room(self, size: int) -> torch.Tensor:
        if size > len(self._payload):
            self._payload = torch.zeros(max(size, 2 * len(self._payload)), dtype=torch.int64)
        return self._payload
