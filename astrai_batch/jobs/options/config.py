"""The configuration of one `astrai-batch run`: every option, validated, from flags or TOML.

Options are flat names (the long flag without its dashes: ``max_num_seqs``, ``max_tokens``);
a TOML file given with ``--config`` (read by `config_file`) may spell them with dashes or
underscores. Sampling options become the job's default `SamplingParams`, which per-row
overrides then replace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from astrai_batch.checks import require_positive_int, require_type
from astrai_batch.engine.attention.backends import resolve_from_options
from astrai_batch.engine.config import check_utilization
from astrai_batch.engine.device_choice import AUTO, choose_dtype, resolve_device_name
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.errors import ConfigError
from astrai_batch.io.image_sources import (
    DEFAULT_MAX_IMAGES_PER_ROW,
    DEFAULT_MAX_PIXELS,
    ImageLimits,
)
from astrai_batch.jobs.options.constraint_options import CONSTRAINT_OPTIONS, job_constraint
from astrai_batch.jobs.options.engine_options import check_engine_options
from astrai_batch.jobs.options.executor_options import check_executor_options
from astrai_batch.jobs.options.io_options import (
    check_image_options,
    check_io_options,
    output_format_for,
)
from astrai_batch.jobs.options.lora_options import (
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_LORAS,
    check_lora_options,
    parse_lora,
)
from astrai_batch.jobs.options.openai_options import (
    check_parsers,
    check_served_names,
    parse_served_names,
)
from astrai_batch.jobs.options.option_groups import (
    OBJECT_OPTIONS,
    PLANNING_OPTIONS,
    RESULT_OPTIONS,
    SAMPLING_OPTIONS,
)
from astrai_batch.jobs.options.option_values import (
    ErrorLimit,
    parse_columns,
    parse_json_object,
    parse_size,
)
from astrai_batch.jobs.options.parallel_options import check_tensor_parallel_options
from astrai_batch.jobs.options.task_options import (
    check_embed_options,
    check_task,
    check_task_sampling,
    task_prompt_column,
)
from astrai_batch.jobs.planning.prefix_order import PlanningOptions

DEFAULT_MODEL = "smollm2-135m"
IMAGE_LIMIT_DEFAULTS = {
    "max_images_per_row": DEFAULT_MAX_IMAGES_PER_ROW,
    "max_image_pixels": DEFAULT_MAX_PIXELS,
}

# The CLI default for max_tokens; SamplingParams' own default happens to agree.
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class JobConfig:
    """Every option of a run. Construct with `from_options`, which parses and checks types."""

    model: str = DEFAULT_MODEL
    revision: str | None = None
    trust_remote_code: bool = False
    device: str = AUTO  # resolved in __post_init__: cuda when available, else cpu
    dtype: str = AUTO  # resolved: `device_choice.choose_dtype`
    threads: int | None = None
    page_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 1024
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    prefix_cache: bool = True
    fast_numerics: bool = False  # step-shaped kernels: a row's last bits move with the batch
    attention_backend: str = "auto"  # auto, sdpa, flashinfer, flash-attn
    cuda_graphs: bool | None = None  # decode-only steps as CUDA graphs; None: on with CUDA
    kv_layout: str = "paged"
    max_model_len: int | None = None
    grouping: bool = True
    group_window: int = 100_000
    seed: int = 0
    input_format: str | None = None
    prompt_column: str | None = None
    id_column: str | None = None
    keep_columns: tuple[str, ...] = ()
    # Rows' images: a column of them (`io.image_parts`), and the limits on them
    # (`io.image_sources.ImageLimits`; docs/multimodal.md)
    image_column: str | None = None
    max_images_per_row: int = DEFAULT_MAX_IMAGES_PER_ROW
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    # Variables for the chat template (e.g. enable_thinking); rows may add to them.
    chat_template_kwargs: dict[str, Any] | None = None
    # The names OpenAI lines' body.model may give the base model (empty: --model as given)
    served_model_name: tuple[str, ...] = ()
    # Read tool calls (tool_choice auto) and reasoning out of the model's text
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(max_tokens=DEFAULT_MAX_TOKENS)
    )
    # None: from OUTPUT's name (`io_options.output_format_for`), resolved by `for_output`
    output_format: str | None = None
    save_tokens: bool = False
    overwrite: bool = False
    restart: bool = False
    max_errors: ErrorLimit | None = None
    fail_on_row_errors: bool = False
    checkpoint_rows: int = 10_000
    checkpoint_seconds: float = 60.0
    progress_seconds: float = 30.0
    quiet: bool = False
    summary_json: str | None = None
    # Where the job runs: this process, or Ray workers (see jobs/executors).
    executor: str = "local"
    ray_address: str | None = None
    workers: int = 1
    worker_threads: int = 1
    worker_gpus: float = 0.0
    # LoRA adapters by name, in the order given (`--lora NAME=PATH`, or a [lora] table)
    lora: tuple[tuple[str, str], ...] = ()
    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    task: str = "generate"  # or "score": log-likelihoods of continuations (io/task_fields.py)
    # --task embed: pooling (None: the model's sentence-transformers config, else last),
    # unit L2 norm, Matryoshka truncation
    pooling: str | None = None
    normalize: bool = True
    dimensions: int | None = None
    # Tensor parallelism: the model's layers split over this many ranks (engine/parallel);
    # a rank that dies or does not answer for tp_timeout seconds ends the job.
    tensor_parallel_size: int = 1
    tp_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name in ("model", "device", "dtype"):
            require_type(name, getattr(self, name), str)
            if not getattr(self, name).strip():
                raise ConfigError(f"{name} must not be empty")
        # One concrete device and dtype from here on (identity, summary, loading). Ray
        # workers get a GPU only through worker_gpus, so that decides `auto` there.
        cuda = bool(self.worker_gpus) if self.executor == "ray" else None
        device = resolve_device_name(self.device, cuda=cuda)
        object.__setattr__(self, "device", device)
        dtype, why = choose_dtype(self.dtype, device, local=self.executor != "ray")
        object.__setattr__(self, "dtype", dtype)
        # why this dtype, for the summary: not an option (a resumed or Ray-shipped config,
        # given the resolved name, says "given")
        object.__setattr__(self, "dtype_choice", why)
        for name in (
            "page_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "group_window",
            "workers",
            "worker_threads",
            "max_loras",
            "max_lora_rank",
            "tensor_parallel_size",
            "max_images_per_row",
            "max_image_pixels",
        ):
            require_positive_int(name, getattr(self, name))
        check_lora_options(self.lora, self.max_loras)
        check_served_names(self.served_model_name)
        check_parsers(self.tool_call_parser, self.reasoning_parser)
        require_positive_int("checkpoint_rows", self.checkpoint_rows)
        for name in ("kv_cache_memory", "threads", "max_model_len"):
            if getattr(self, name) is not None:
                require_positive_int(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        check_utilization(self.gpu_memory_utilization)
        for name in (
            "trust_remote_code",
            "prefix_cache",
            "fast_numerics",
            "grouping",
            "save_tokens",
            "overwrite",
            "restart",
            "fail_on_row_errors",
            "quiet",
        ):
            require_type(name, getattr(self, name), bool)
        check_tensor_parallel_options(self)
        for name in ("checkpoint_seconds", "progress_seconds", "tp_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        check_image_options(self.image_column, self.prompt_column, self.task)
        for name in ("revision", "input_format", "prompt_column", "id_column", "summary_json"):
            value = getattr(self, name)
            if value is not None:
                require_type(name, value, str)
        check_engine_options(self.kv_layout, self.attention_backend, self.cuda_graphs, self.device)
        check_io_options(
            self.input_format, self.output_format, self.keep_columns, self.chat_template_kwargs
        )
        check_executor_options(
            self.executor, self.ray_address, self.workers, self.worker_threads, self.worker_gpus
        )
        if not isinstance(self.sampling, SamplingParams):
            raise ConfigError(
                f"sampling must be SamplingParams, got {type(self.sampling).__name__}"
            )
        check_task(self.task, self.output_format)
        check_task_sampling(self.task, self.sampling, SamplingParams(max_tokens=DEFAULT_MAX_TOKENS))
        check_embed_options(self.pooling, self.normalize, self.dimensions)
        if self.max_errors is not None and not isinstance(self.max_errors, ErrorLimit):
            raise ConfigError(f"max_errors must be an ErrorLimit, got {self.max_errors!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], source: str = "options") -> JobConfig:
        """A config from flat option names (dashes or underscores); unknown names are refused.

        Sampling options go into `sampling`; `kv_cache_memory` may be a size string,
        `max_errors` a count / fraction / percentage, `keep_columns` a comma-separated string.
        """
        values = {str(key).replace("-", "_"): value for key, value in options.items()}
        known = {f.name for f in dataclasses.fields(cls)} - {"sampling"}
        known |= {*SAMPLING_OPTIONS, *CONSTRAINT_OPTIONS}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown option(s) in {source}: {', '.join(unknown)}")
        sampling = {name: values.pop(name) for name in SAMPLING_OPTIONS if name in values}
        sampling.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        sampling["constraint"] = job_constraint(
            {name: values.pop(name) for name in CONSTRAINT_OPTIONS if name in values}
        )
        values["sampling"] = SamplingParams.from_dict(sampling)
        if values.get("kv_cache_memory") is not None:
            values["kv_cache_memory"] = parse_size(values["kv_cache_memory"])
        if values.get("max_errors") is not None:
            values["max_errors"] = ErrorLimit.parse(values["max_errors"])
        if "keep_columns" in values:
            values["keep_columns"] = parse_columns(values["keep_columns"])
        if "lora" in values:
            values["lora"] = parse_lora(values["lora"])
        if "served_model_name" in values:
            values["served_model_name"] = parse_served_names(values["served_model_name"])
        for name in OBJECT_OPTIONS:
            if values.get(name) is not None:
                values[name] = parse_json_object(values[name], name)
        return cls(**values)

    def for_output(self, name: str, *, directory: bool) -> JobConfig:
        """This configuration with the output format resolved for an OUTPUT called `name`
        (`directory`: it is an existing directory or ends in /); refuses a contradiction."""
        chosen = output_format_for(name, directory=directory, given=self.output_format)
        if chosen == self.output_format:
            return self
        resolved = dataclasses.replace(self, output_format=chosen)
        # the replace resolved an already concrete dtype again: keep what `auto` saw
        object.__setattr__(resolved, "dtype_choice", getattr(self, "dtype_choice", None))
        return resolved

    def input_options(self) -> dict[str, Any]:
        """Keyword arguments of `io.open_input` for this job's input."""
        return {
            "input_format": self.input_format,
            "prompt_column": task_prompt_column(self.task, self.prompt_column),
            "id_column": self.id_column,
            "keep_columns": self.keep_columns,
            "task": self.task,
            "image_column": self.image_column,
            "max_images_per_row": self.max_images_per_row,
        }

    def image_limits(self) -> ImageLimits:
        """What this job accepts of one row's images (`io.image_sources.load_image`)."""
        return ImageLimits(
            max_pixels=self.max_image_pixels, max_images_per_row=self.max_images_per_row
        )

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments of `EngineConfig` (kept here so jobs/ owns the mapping)."""
        return {
            "page_size": self.page_size,
            "kv_cache_memory": self.kv_cache_memory,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_prefix_cache": self.prefix_cache,
            "kv_layout": self.kv_layout,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "numerics": "fast" if self.fast_numerics else "invariant",
            "attention_backend": self.attention_backend,
            "cuda_graphs": self.cuda_graphs,
        }

    def resolved_attention_backend(self) -> str:
        """The attention backend this process would run (refusing one that cannot run here),
        from the options alone, so a local run refuses before the model loads."""
        return resolve_from_options(
            self.attention_backend,
            device=self.device,
            dtype=self.dtype,
            numerics="fast" if self.fast_numerics else "invariant",
            page_size=self.page_size,
        )

    def model_options(self) -> dict[str, Any]:
        """Keyword arguments of `load_model` beside the model itself."""
        return {
            "device": self.device,
            "dtype": self.dtype,
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel_size,
            "tp_timeout": self.tp_timeout,
        }

    def to_dict(self) -> dict[str, Any]:
        """The effective configuration as JSON-ready flat options (stored in output metadata)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "sampling":
                # The job seed is `seed`; the sampling params' own seed is a per-row field.
                out.update({k: v for k, v in value.to_dict().items() if k in SAMPLING_OPTIONS})
            elif f.name == "max_errors":
                out[f.name] = None if value is None else value.describe()
            elif f.name == "lora":
                out[f.name] = dict(value)
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def result_options(self) -> dict[str, Any]:
        """The values of `RESULT_OPTIONS`: what a resumed run must share (see there)."""
        options = self.to_dict()
        out = {name: options[name] for name in RESULT_OPTIONS}
        # image limits at their defaults are left out, so a checkpoint written before they
        # existed (no such keys) resumes under the defaults
        for name, default in IMAGE_LIMIT_DEFAULTS.items():
            if out[name] == default:
                del out[name]
        out["device"] = self.device.split(":", 1)[0].strip().lower()
        return out

    def planning_options(self) -> PlanningOptions:
        """The values of `PLANNING_OPTIONS`, as a new checkpoint records them."""
        return PlanningOptions.from_dict({name: getattr(self, name) for name in PLANNING_OPTIONS})
