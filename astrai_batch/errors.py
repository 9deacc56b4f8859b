"""The error hierarchy. The CLI turns these into `click.ClickException`s with their message."""

from __future__ import annotations


class AstraiBatchError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(AstraiBatchError, ValueError):
    """A configuration value is invalid or unknown."""


class ModelLoadError(AstraiBatchError):
    """A model could not be found, converted, or is not supported."""


class UnsupportedModelError(ModelLoadError):
    """The model loads, but its architecture is one the engine cannot run correctly."""


class InputError(AstraiBatchError):
    """The input file as a whole cannot be read (missing, unreadable, no usable prompt column)."""


class OutputError(AstraiBatchError):
    """The output cannot be written (exists without --overwrite, unwritable directory)."""


class CheckpointError(AstraiBatchError):
    """A checkpoint exists but belongs to a different job, or is damaged."""


class CacheCapacityError(AstraiBatchError):
    """A KV-cache operation needed more pages than the pool can ever provide."""


class JobAbortedError(AstraiBatchError):
    """The job stopped on purpose, e.g. more failed rows than --max-errors allows."""


class NumericsUnavailableError(AstraiBatchError):
    """Batch-invariant numerics cannot be kept on this machine (its BLAS gives no invariant
    GEMM shape); `--fast-numerics` runs anyway."""


class ExecutorError(AstraiBatchError):
    """The executor failed under the job (a Ray worker, the cluster, a task)."""


class AdapterError(ConfigError):
    """A LoRA adapter cannot be read, is of an unsupported kind, or does not fit the model."""


class RankFailureError(AstraiBatchError):
    """A tensor-parallel rank died, hung past the timeout, or could not load its shard."""


class ImageError(AstraiBatchError):
    """One image of a row cannot be used (unreadable, undecodable, over a limit); the job
    makes it that row's error."""
