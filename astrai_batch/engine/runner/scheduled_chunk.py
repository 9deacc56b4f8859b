"""`ScheduledChunk`: one sequence's share of a step, as the scheduler hands it to the runner."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple


class ScheduledChunk(NamedTuple):
    """Compute `token_ids` at positions [start, start + len) of one sequence.

    A named tuple, not a dataclass: a step makes one per scheduled sequence, and a frozen
    dataclass's field-by-field `__init__` cost a few microseconds each at 256 sequences.
    """

    token_ids: Sequence[int]
    start: int
    pages: Sequence[int]  # the sequence's page table, covering at least start + len tokens
    wants_logits: bool  # the chunk ends at the sequence's last known token
    # The sequence and its page table's version (`KVCacheManager.pages_version`): the runner
    # keeps the table between steps and rewrites it only when the version changes. None: the
    # table is written for this step only.
    seq_key: Hashable | None = None
    pages_version: int | None = None
    adapter: int = 0  # the sequence's LoRA adapter slot (`lora.bank`); 0: the base model
    # rows [first, stop) of this chunk whose logits are wanted besides the sampling row
    # (prompt positions: `engine.sampling.prompt_logprobs`); they come after every sampling
    # row in `ForwardOutput.logits`, in chunk order
    logit_span: tuple[int, int] | None = None
    # the sequence's images (`engine.vision.image_inputs.ImageInput`): the runner puts their
    # features at the placeholder positions this chunk covers
    images: tuple = ()
