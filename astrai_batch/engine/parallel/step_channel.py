"""Rank 0's commands to the other ranks: a step's arrays, a job's adapters, a new engine, stop.

A command is one broadcast of a preallocated host buffer of int64: a 9-int header (command
and sizes) followed by the payload, inline up to `INLINE` ints (a decode step of a few
hundred sequences fits); a larger payload's rest follows in a second broadcast of exactly
its size (both buffers grow alike on every rank). A step's payload is its `StepArrays`
packed end to end (token ids, positions, write slots, logit rows, chunk starts, token
counts, context starts, decode rows, the page-table matrix, and with LoRA adapters installed
each chunk's adapter slot): the ranks rebuild the attention plan and the rows' adapter
grouping from it exactly as rank 0 does, so rank 0's scheduler, cache manager and samplers
have no counterpart elsewhere. One broadcast per step, not a header then a payload: on a busy
machine each broadcast costs a wake-up of every receiving rank. A job's adapters reach the
ranks once, before its engine, as their names, paths and digests (each rank reads and slices
its own: `sharded_adapters`).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from astrai_batch.engine.attention.step_arrays import StepArrays
from astrai_batch.engine.parallel.rank_group import IDLE_WAIT_S, RankGroup

STOP, STEP, ENGINE, ADAPTERS = 0, 1, 2, 3
_HEADER = 9
INLINE = 8192  # payload ints sent with the header (64 KiB)


class ReceivedStep(NamedTuple):
    arrays: StepArrays
    adapters: np.ndarray | None  # [C] each chunk's adapter slot; None: no adapters installed


class StepChannel:
    def __init__(self, group: RankGroup) -> None:
        self._group = group
        self._buffer = torch.zeros(_HEADER + INLINE, dtype=torch.int64)
        self._in_flight: list = []  # rank 0: waits of broadcasts not yet known complete

    # -- rank 0 ----------------------------------------------------------------------------

    def send_step(self, step: StepArrays, adapters: Sequence[int] | None = None) -> None:
        """`adapters`: each chunk's LoRA adapter slot, when the model has adapters."""
        self.flush()  # the buffer is about to change
        c, p = step.page_tables.shape
        t, n_logits, d = len(step.token_ids), len(step.logit_rows), len(step.decodes)
        slots = 0 if adapters is None else c
        size = 3 * t + n_logits + 3 * c + d + c * p + slots
        payload = self._room(size).numpy()[_HEADER:]
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
        payload[at : at + c * p] = step.page_tables.reshape(-1)
        if adapters is not None:
            payload[at + c * p : size] = adapters
        self._send(STEP, t, n_logits, c, p, d, step.longest_context, slots > 0, size=size)

    def send_engine(self, settings: Any) -> None:
        """A new engine's settings (picklable); every rank assembles its own from them."""
        self._send_object(ENGINE, settings)

    def send_adapters(self, specs: list[tuple[str, str, str]], max_rank: int) -> None:
        """The job's adapters as (name, path, digest), sent before its engine."""
        self._send_object(ADAPTERS, (specs, max_rank))

    def _send_object(self, command: int, value: Any) -> None:
        self.flush()
        data = np.frombuffer(pickle.dumps(value), dtype=np.uint8)
        size = -(-len(data) // 8)
        room = self._room(size)
        room.numpy()[_HEADER:].view(np.uint8)[: len(data)] = data
        self._send(command, len(data), size=size)

    def send_stop(self) -> None:
        self.flush()
        self._send(STOP, size=0)
        self.flush()

    def flush(self) -> None:
        """Waits until every broadcast started is complete (raises if one failed)."""
        while self._in_flight:
            self._in_flight.pop(0)()

    def _send(self, command: int, *values: int, size: int) -> None:
        header = self._buffer.numpy()[:_HEADER]
        header[:] = 0
        header[0] = command
        header[1 : 1 + len(values)] = values
        header[_HEADER - 1] = size
        # not waited for here: rank 0's forward starts while the other ranks wake up, and its
        # first collective meets them anyway; the next send (or a stop) waits first
        buffer = self._buffer
        self._in_flight.append(self._group.broadcast_started(buffer[: _HEADER + INLINE]))
        if size > INLINE:  # the rest of a large payload
            rest = buffer[_HEADER + INLINE : _HEADER + size]
            self._in_flight.append(self._group.broadcast_started(rest))

    # -- the other ranks -------------------------------------------------------------------

    def receive(self) -> tuple[int, Any]:
        """(STEP, ReceivedStep) | (ENGINE, settings) | (ADAPTERS, (specs, max_rank)) |
        (STOP, None). A step's arrays are views of the buffer: valid until the next
        `receive`."""
        buffer = self._buffer
        # the wait for the next command is patient: rank 0 may be busy elsewhere
        self._group.broadcast(buffer[: _HEADER + INLINE], wait_s=IDLE_WAIT_S)
        command, *values, size = buffer[:_HEADER].tolist()
        if size > INLINE:
            buffer = self._room(size)
            self._group.broadcast(buffer[_HEADER + INLINE : _HEADER + size])
        if command == STOP:
            return STOP, None
        flat = buffer.numpy()[_HEADER:]
        if command in (ENGINE, ADAPTERS):
            return command, pickle.loads(flat.view(np.uint8)[: values[0]].tobytes())
        if command != STEP:
            raise ValueError(f"unknown tensor-parallel command {command}")
        t, n_logits, c, p, d, longest, with_adapters = values[:7]
        at = 0
        parts = []
        for length in (t, t, t, n_logits, c, c, c, d):
            parts.append(flat[at : at + length])
            at += length
        tables = flat[at : at + c * p].reshape(c, p)
        at += c * p
        arrays = StepArrays(
            *parts[:7], page_tables=tables, decodes=parts[7], longest_context=longest
        )
        return STEP, ReceivedStep(arrays, flat[at : at + c] if with_adapters else None)

    def _room(self, size: int) -> torch.Tensor:
        """The buffer, grown (keeping what it holds) to hold a payload of `size` ints."""
        old = self._buffer
        if _HEADER + size > len(old):
            grown = torch.zeros(max(_HEADER + size, 2 * len(old)), dtype=torch.int64)
            grown[: len(old)] = old
            self._buffer = grown
        return self._buffer
