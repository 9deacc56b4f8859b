"""What the job flow asks of an executor, and what an executor gives back.

The job flow (`jobs.job`) owns everything a job is: option and output checks, identity, the
checkpoint, resume, the summary, exit status and the final commit. An executor turns the
planned rows of an open checkpoint into committed parts: `local` in this process
(`local_executor`), `ray` on Ray workers (`ray_job`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from astrai_batch.io import InputSource
from astrai_batch.jobs.output.checkpoint import Checkpoint, ExecutorMark
from astrai_batch.jobs.output.stats import WorkStats
from astrai_batch.jobs.progress import Progress

if TYPE_CHECKING:
    from astrai_batch.engine.lora.adapter_files import AdapterFiles

__all__ = ["ExecutionResult", "Executor", "ModelFacts"]


@dataclass(frozen=True)
class ExecutionResult:
    """What this process did. `signum` is set when a signal stopped the job."""

    run_stats: WorkStats
    wall_seconds: float
    signum: int | None


@dataclass(frozen=True)
class ModelFacts:
    """What the job flow needs of the model: its identity (for the job's), the name outputs
    carry, the tokenizer (OpenAI logprob tokens) and its architecture (output metadata; None
    when the executor has not loaded the model itself)."""

    identity: dict[str, Any]
    name: str
    tokenizer: Any
    architecture: str | None
    hidden_size: int | None = None  # None when the executor has not loaded the model
    # --task embed: the vector's size before --dimensions (a sentence-transformers Dense
    # module's output size, else the hidden size); None otherwise
    embedding_size: int | None = None
    # torch CPU threads of this process's engine (None: the engines run elsewhere, Ray)
    threads: int | None = None


class Executor(Protocol):
    def mark(self) -> ExecutorMark:
        """Which parts this executor writes (recorded in the checkpoint's manifest)."""
        ...

    def prepare(
        self, source: InputSource, progress: Progress, adapters: Sequence[AdapterFiles] = ()
    ) -> ModelFacts:
        """Load what the job needs before its checkpoint opens; refuse what cannot run.
        `adapters`: the job's LoRA adapters, read and checked by the flow."""
        ...

    def execute(
        self,
        checkpoint: Checkpoint,
        source: InputSource,
        schema: pa.Schema,
        total_rows: int,
        progress: Progress,
    ) -> ExecutionResult:
        """Run every row the checkpoint lacks, committing parts into it. Raises
        `JobAbortedError` when --max-errors stops the job."""
        ...

    def architecture(self, checkpoint: Checkpoint) -> str | None:
        """The model's architecture, once the rows are done (for the output's metadata)."""
        ...

    def close(self) -> None:
        """Releases what `prepare` started (a tensor-parallel model's ranks)."""
        ...
