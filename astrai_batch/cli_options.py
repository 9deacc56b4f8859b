"""The flags of `astrai-batch run`, each named as its JobConfig / TOML key, and the
model-source flags `run` and `plan` share. Kept apart from the commands (`cli`): the flag
list grows with every option, the commands do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from astrai_batch.engine.attention.backends import ATTENTION_BACKENDS
from astrai_batch.engine.config import KV_LAYOUTS
from astrai_batch.engine.device_choice import AUTO, DEVICE_HELP, DTYPE_HELP
from astrai_batch.engine.tasks.embedding_types import POOLINGS
from astrai_batch.io.reasoning_parsers import REASONING_PARSERS
from astrai_batch.io.tool_parsers import TOOL_PARSERS
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.options.io_options import OUTPUT_FORMATS
from astrai_batch.jobs.options.task_options import TASKS

JOB_DEFAULTS = JobConfig()


def option(flag: str, default: Any = None, help: str | None = None, **kwargs: Any) -> Any:
    """A click option that shows its default, when it has one."""
    shown = default is not None and not kwargs.get("is_flag")
    return click.option(flag, default=default, show_default=shown, help=help, **kwargs)


def model_source_options() -> list[Any]:
    """Where a model's files come from: shared by `run` and `plan`."""
    return [
        option("--revision", None, "Branch, tag or commit of a hub model."),
        option(
            "--trust-remote-code",
            help="Allow a model's own Python code to run while it loads.",
            is_flag=True,
            default=False,
        ),
    ]


def run_options(function: Any) -> Any:
    """The options of `run`, each named as its JobConfig / TOML key."""
    d, s = JOB_DEFAULTS, JOB_DEFAULTS.sampling
    flag: dict[str, Any] = {"is_flag": True, "default": False}
    path = click.Path(path_type=Path)
    options = [
        option("--config", None, "TOML file of options (flags win).", type=path),
        # Model and engine.
        option("--model", d.model, "Model directory, .gguf file, alias or hub id."),
        *model_source_options(),
        option("--device", AUTO, DEVICE_HELP),
        option("--dtype", AUTO, DTYPE_HELP),
        option(
            "--lora",
            None,
            "LoRA adapter NAME=PATH (a PEFT adapter directory or URI; repeatable); rows pick "
            "one by their lora field.",
            multiple=True,
        ),
        option(
            "--served-model-name",
            None,
            "A name OpenAI lines' body.model may give the model (repeatable; the first is "
            "the name responses carry) [default: --model as given].",
            multiple=True,
        ),
        option(
            "--tool-call-parser",
            None,
            "Read tool calls (tool_choice auto) out of the model's text in this format.",
            type=click.Choice(list(TOOL_PARSERS)),
        ),
        option(
            "--reasoning-parser",
            None,
            "Split the model's reasoning from its answer (reasoning_content; a reasoning column).",
            type=click.Choice(list(REASONING_PARSERS)),
        ),
        option("--max-loras", d.max_loras, "Most LoRA adapters in a job.", type=int),
        option("--max-lora-rank", d.max_lora_rank, "Largest LoRA rank accepted.", type=int),
        # Where the job runs.
        option(
            "--executor",
            d.executor,
            "local: this process; ray: prefix-aware shards on a Ray cluster.",
            type=click.Choice(["local", "ray"]),
        ),
        option("--ray-address", None, "Ray cluster to join (e.g. auto) [default: start one]."),
        option("--workers", d.workers, "Engine workers (shards) with --executor ray.", type=int),
        option("--worker-threads", d.worker_threads, "Torch threads per Ray worker.", type=int),
        option("--worker-gpus", d.worker_gpus, "GPUs per Ray worker.", type=float),
        option(
            "--tensor-parallel-size",
            d.tensor_parallel_size,
            "Split the model over this many ranks (GPUs with CUDA, processes on CPU).",
            type=int,
        ),
        option(
            "--tp-timeout",
            d.tp_timeout,
            "Seconds a tensor-parallel rank may not answer before the job stops.",
            type=float,
        ),
        option(
            "--threads",
            None,
            "CPU threads for torch [default: the CPUs this process may use (affinity, cgroup "
            "quota)]; fewer when other work shares them.",
            type=int,
        ),
        option("--max-num-seqs", d.max_num_seqs, "Most sequences decoded together.", type=int),
        option("--max-num-batched-tokens", d.max_num_batched_tokens, "Tokens per step.", type=int),
        option(
            "--kv-cache-memory",
            None,
            "KV cache size, e.g. 2GiB or 512MiB [default: 30% of the available RAM on CPU, "
            "--gpu-memory-utilization on CUDA; less if the model needs less].",
        ),
        option(
            "--gpu-memory-utilization",
            d.gpu_memory_utilization,
            "Share of the GPU's memory for weights, activations and the KV cache (CUDA).",
            type=float,
        ),
        option("--page-size", d.page_size, "Tokens per KV page (prefix-cache unit).", type=int),
        option("--prefix-cache/--no-prefix-cache", d.prefix_cache, "Reuse shared prefixes."),
        option(
            "--fast-numerics",
            help="Step-shaped kernels: faster, but a row's output may depend on its batch "
            "(for jobs that neither sample nor resume; a checkpoint keeps its numerics).",
            **flag,
        ),
        option(
            "--attention-backend",
            d.attention_backend,
            "sdpa: portable, batch-invariant; flashinfer, flash-attn: one paged CUDA kernel per "
            "layer (with --fast-numerics); auto: sdpa unless --fast-numerics on CUDA, then the "
            "first installed kernel.",
            type=click.Choice(list(ATTENTION_BACKENDS)),
        ),
        option(
            "--cuda-graphs/--no-cuda-graphs",
            None,
            "Replay decode-only steps as CUDA graphs [default: on when the device is CUDA].",
        ),
        option(
            "--kv-layout",
            d.kv_layout,
            "paged: pages on demand, prefix reuse; contiguous: one full-context seat per "
            "sequence, no prefix reuse.",
            type=click.Choice(list(KV_LAYOUTS)),
        ),
        option(
            "--max-model-len",
            None,
            "Cap on prompt + output tokens [default: the model's context]; also the size of a "
            "contiguous seat.",
            type=int,
        ),
        option("--grouping/--no-grouping", d.grouping, "Run shared prefixes together."),
        option("--group-window", d.group_window, "Rows read and ordered together.", type=int),
        # Input.
        option(
            "--input-format",
            None,
            "Overrides the format told by the file name.",
            type=click.Choice(["parquet", "jsonl"]),
        ),
        option("--prompt-column", None, "Column holding the prompt."),
        option("--id-column", None, "Column holding the row id."),
        option("--keep-columns", None, "Comma-separated input columns copied to the output."),
        option(
            "--image-column",
            None,
            "Column of each row's images (bytes, path, URI, data URL, {bytes, path} struct, or "
            "a list), placed before the prompt in a user message.",
        ),
        option(
            "--max-images-per-row",
            d.max_images_per_row,
            "A row with more images is a row error.",
            type=int,
        ),
        option(
            "--max-image-pixels",
            d.max_image_pixels,
            "An image of more pixels (width x height) is its row's error.",
            type=int,
        ),
        option(
            "--chat-template-kwargs",
            None,
            """Chat template variables as a JSON object, e.g. '{"enable_thinking": false}'.""",
        ),
        # Sampling defaults; rows may override them.
        option("--max-tokens", s.max_tokens, type=int),
        option("--min-tokens", s.min_tokens, type=int),
        option("--temperature", s.temperature, "0 decodes greedily.", type=float),
        option("--top-p", s.top_p, type=float),
        option("--top-k", s.top_k, "0 disables top-k.", type=int),
        option("--min-p", s.min_p, type=float),
        option("--repetition-penalty", s.repetition_penalty, type=float),
        option("--presence-penalty", s.presence_penalty, type=float),
        option("--frequency-penalty", s.frequency_penalty, type=float),
        option("--stop", None, "Stop string (repeatable).", multiple=True),
        option("--n", s.n, "Samples per prompt.", type=int),
        option("--ignore-eos", help="Generate past end-of-sequence tokens.", **flag),
        # The job-wide output constraint (one of them); a row's own constraint replaces it.
        option("--json-schema", None, "Outputs are JSON valid under this schema file."),
        option("--regex", None, "Outputs fully match this regular expression."),
        option("--choice", None, "Outputs are exactly one of these comma-separated strings."),
        option("--grammar", None, "Outputs follow this EBNF grammar file (rule root)."),
        option("--seed", d.seed, "Job seed: sampled rows reproduce for a given seed.", type=int),
        option("--task", d.task, "generate, score or embed.", type=click.Choice(TASKS)),
        option(
            "--pooling",
            None,
            "embed: the pooling (default: the model's sentence-transformers one, else last).",
            type=click.Choice(POOLINGS),
        ),
        click.option(
            "--normalize/--no-normalize", default=True, help="embed: unit L2 norm (default on)."
        ),
        option("--dimensions", None, "embed: keep the first N values.", type=int),
        # Output.
        option(
            "--output-format",
            None,
            "[default: from OUTPUT's name: .parquet, .jsonl (openai-jsonl), a directory or a "
            "name ending in / (parquet-dir)]; a name it contradicts is refused.",
            type=click.Choice(list(OUTPUT_FORMATS)),
        ),
        option("--save-tokens", help="Add completion_token_ids.", **flag),
        option("--logprobs", help="Add the logprob of each generated token.", **flag),
        option("--top-logprobs", s.top_logprobs, "Per token its N likeliest (0-20).", type=int),
        option("--prompt-logprobs", None, "Per prompt token its logprob, N likeliest.", type=int),
        option("--overwrite", help="Replace an existing output.", **flag),
        option("--summary-json", None, "Also write the JSON summary to this file."),
        # Reliability and operation.
        option("--restart", help="Discard an existing checkpoint and start over.", **flag),
        option("--checkpoint-rows", d.checkpoint_rows, "Save finished rows this often", type=int),
        option("--checkpoint-seconds", d.checkpoint_seconds, "...and this often.", type=float),
        option("--max-errors", None, "Abort past this many failed rows: 10, 0.05 or 5%."),
        option("--fail-on-row-errors", help="Exit with 3 when some rows failed.", **flag),
        option(
            "--progress-seconds", d.progress_seconds, "Progress line interval (no TTY).", type=float
        ),
        click.option("--quiet", "-q", is_flag=True, default=False, help="No progress output."),
    ]
    for decorate in reversed(options):
        function = decorate(function)
    return function
