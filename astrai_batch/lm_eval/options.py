"""lm-eval's arguments in our terms: `model_args` are `astrai-batch run` option names, a
request's `gen_kwargs` become `SamplingParams`.

lm-eval parses ``model=...,dtype=...`` itself (``true``/``false`` and numbers typed); the
options that shape the model and the engine are accepted, the job's file and output options
are refused by name, so a typo fails before the model loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.options.config import JobConfig

# `astrai-batch run` options that mean something for an in-process evaluation
MODEL_ARGS = frozenset(
    {
        "model",
        "revision",
        "trust_remote_code",
        "device",
        "dtype",
        "threads",
        "page_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_cache_memory",
        "gpu_memory_utilization",
        "prefix_cache",
        "fast_numerics",
        "attention_backend",
        "cuda_graphs",
        "kv_layout",
        "max_model_len",
        "seed",
        "chat_template_kwargs",
        "lora",
        "max_loras",
        "max_lora_rank",
        "tensor_parallel_size",
        "tp_timeout",
    }
)

# gen_kwargs lm-eval tasks pass that we map (after lm-eval's own `normalize_gen_kwargs`)
_SAMPLING_KWARGS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "seed": "seed",
}


def job_config(model_args: Mapping[str, Any]) -> JobConfig:
    """The `JobConfig` of `model_args` (our option names; dashes or underscores)."""
    values = {str(key).replace("-", "_"): value for key, value in model_args.items()}
    unknown = sorted(set(values) - MODEL_ARGS)
    if unknown:
        raise ConfigError(
            f"unknown model_args for astrai-batch: {', '.join(unknown)} (known: "
            f"{', '.join(sorted(MODEL_ARGS))})"
        )
    lora = values.get("lora")
    if isinstance(lora, str):
        # lm-eval splits model_args on commas: several adapters are separated by ';'
        values["lora"] = [item for item in lora.split(";") if item.strip()]
    config = JobConfig.from_options(values, source="model_args")
    if len(config.lora) > 1:
        raise ConfigError(
            "model_args lora takes one adapter (NAME=PATH): every request of an evaluation "
            "runs with it"
        )
    return config


def sampling_params(
    kwargs: Mapping[str, Any], *, max_tokens: int, stop: list[str], stop_token_ids: tuple[int, ...]
) -> SamplingParams:
    """A request's sampling from lm-eval's normalized gen_kwargs (`until` and `max_gen_toks`
    already taken out): greedy unless `do_sample`; other keys are refused by name."""
    rest = dict(kwargs)
    do_sample = bool(rest.pop("do_sample", False))
    values: dict[str, Any] = {}
    for key, value in rest.items():
        if key not in _SAMPLING_KWARGS:
            raise ConfigError(
                f"gen_kwargs {key!r} is not supported by astrai-batch (supported: until, "
                f"max_gen_toks, do_sample, {', '.join(_SAMPLING_KWARGS)})"
            )
        values[_SAMPLING_KWARGS[key]] = value
    if not do_sample:
        values["temperature"] = 0.0  # lm-eval's rule: do_sample=False is greedy decoding
    for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
        if name in values:
            values[name] = float(values[name])
    return SamplingParams.from_dict(
        {
            **values,
            "max_tokens": max_tokens,
            "stop": [text for text in stop if text],
            "stop_token_ids": list(stop_token_ids),
        }
    )
