"""The engine: model loading, paged-attention runner, scheduler, sampling, async API.

Names are imported lazily so that light modules (sampling parameters, configuration) can be
used without loading torch and transformers.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "Engine": "astrai_batch.engine.async_engine",
    "generate_sync": "astrai_batch.engine.async_engine",
    "EngineConfig": "astrai_batch.engine.config",
    "SamplingParams": "astrai_batch.engine.sampling.params",
    "EngineStats": "astrai_batch.engine.types",
    "GenerationRequest": "astrai_batch.engine.types",
    "GenerationResult": "astrai_batch.engine.types",
    "Timings": "astrai_batch.engine.types",
    "LoadedModel": "astrai_batch.engine.model.loader",
    "load_model": "astrai_batch.engine.model.loader",
    "load_tokenizer": "astrai_batch.engine.model.loader",
    "set_cpu_threads": "astrai_batch.engine.threads",
    "keep_freed_memory": "astrai_batch.engine.malloc_tuning",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'astrai_batch.engine' has no attribute {name!r}")
    return getattr(import_module(module), name)
