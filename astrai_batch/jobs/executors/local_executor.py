"""The local executor: the job's windows over one engine in this process
(`local_execution.JobExecution`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pyarrow as pa

from astrai_batch.engine import keep_freed_memory, load_model, set_cpu_threads
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.model.support import require_chat_template
from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.engine.threads import describe_threads
from astrai_batch.errors import ConfigError
from astrai_batch.io import InputSource
from astrai_batch.jobs.crash_points import pause_point
from astrai_batch.jobs.executors.base import ExecutionResult, ModelFacts
from astrai_batch.jobs.executors.local_execution import JobExecution
from astrai_batch.jobs.job_adapters import install_job_adapters
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.output.checkpoint import Checkpoint, ExecutorMark
from astrai_batch.jobs.output.identity import model_identity
from astrai_batch.jobs.planning.embed_rows import job_embed_request
from astrai_batch.jobs.progress import Progress

if TYPE_CHECKING:
    from astrai_batch.engine.lora.adapter_files import AdapterFiles

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


@dataclass
class LocalExecutor:
    config: JobConfig
    loaded: LoadedModel | None = field(default=None, init=False)
    embed: EmbedRequest | None = field(default=None, init=False)  # --task embed's request

    def mark(self) -> ExecutorMark:
        return ExecutorMark("local")

    def prepare(
        self, source: InputSource, progress: Progress, adapters: Sequence[AdapterFiles] = ()
    ) -> ModelFacts:
        config = self.config
        threads = set_cpu_threads(config.threads)
        keep_freed_memory()
        progress.message(f"loading model {config.model} ({describe_threads(threads)})")
        pause_point("model_load")
        loaded = load_model(config.model, **config.model_options(), on_stage=progress.message)
        install_job_adapters(loaded, list(adapters), config)
        if config.max_model_len is not None and config.max_model_len > loaded.max_model_len:
            raise ConfigError(
                f"--max-model-len {config.max_model_len} exceeds the context of model "
                f"{loaded.name!r} ({loaded.max_model_len} tokens)"
            )
        if source.shape == "messages":
            require_chat_template(loaded)
        self.loaded = loaded
        identity = model_identity(loaded, config.revision)
        hidden_size = loaded.model.config.hidden_size
        embedding_size = None
        if config.task == "embed":  # the model's embedding modules, refused here if need be
            self.embed = job_embed_request(
                config.pooling,
                config.normalize,
                config.dimensions,
                loaded.model.name_or_path,
                hidden_size,
            )
            embedding_size = self.embed.width(hidden_size)
        return ModelFacts(
            identity,
            loaded.name,
            loaded.tokenizer,
            loaded.architecture,
            hidden_size=hidden_size,
            embedding_size=embedding_size,
            threads=threads,
        )

    def execute(
        self,
        checkpoint: Checkpoint,
        source: InputSource,
        schema: pa.Schema,
        total_rows: int,
        progress: Progress,
    ) -> ExecutionResult:
        if self.loaded is None:
            raise RuntimeError("prepare() before execute()")
        execution = JobExecution(
            config=self.config,
            loaded=self.loaded,
            source=source,
            checkpoint=checkpoint,
            schema=schema,
            total_rows=total_rows,
            progress=progress,
            embed=self.embed,
        )
        try:
            return anyio.run(execution.run)
        except BaseExceptionGroup as group:
            raise _single(group) from None

    def architecture(self, checkpoint: Checkpoint) -> str | None:
        return self.loaded.architecture if self.loaded is not None else None

    def close(self) -> None:
        if self.loaded is not None:
            self.loaded.close()


def _single(error: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (task groups wrap them)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
