"""A job's LoRA adapters: read and checked before the model loads, installed after it, part
of the job identity by their files' digests, and each row's adapter in the `lora` column."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from astrai_batch.jobs.planning.window import LORA_COLUMN

if TYPE_CHECKING:
    from astrai_batch.engine.lora.adapter_files import AdapterFiles
    from astrai_batch.engine.model.loaded import LoadedModel
    from astrai_batch.jobs.options.config import JobConfig


def read_job_adapters(config: JobConfig) -> list[AdapterFiles]:
    if not config.lora:
        return []
    from astrai_batch.engine.lora.adapter_files import read_adapters

    return read_adapters(config.lora, max_rank=config.max_lora_rank)


def install_job_adapters(
    loaded: LoadedModel, adapters: list[AdapterFiles], config: JobConfig
) -> None:
    """Wraps the model's target layers (before the engine sizes its KV pool, so the adapter
    weights are counted as the model's)."""
    if not adapters:
        return
    if loaded.parallel is not None:  # each rank its slices (`parallel.sharded_adapters`)
        loaded.parallel.install_adapters(loaded.model, adapters, max_rank=config.max_lora_rank)
        return
    from astrai_batch.engine.lora.bank import install_adapters

    install_adapters(loaded.model, adapters, max_rank=config.max_lora_rank)


def load_job_adapters(loaded: LoadedModel, config: JobConfig) -> None:
    """Read and install in one go: what a Ray worker does with the paths or URIs."""
    install_job_adapters(loaded, read_job_adapters(config), config)


def adapter_identity(adapters: list[AdapterFiles]) -> dict[str, str]:
    """{name: digest}: a resume refuses an adapter whose files changed."""
    return {adapter.name: adapter.digest for adapter in adapters}


def with_lora_column(kept: pa.Schema, config: JobConfig) -> pa.Schema:
    """The keep columns of a job with adapters gain `lora` (the adapter a row ran with)."""
    if not config.lora:
        return kept
    if LORA_COLUMN in kept.names:
        kept = kept.remove(kept.get_field_index(LORA_COLUMN))
    return kept.append(pa.field(LORA_COLUMN, pa.string()))
