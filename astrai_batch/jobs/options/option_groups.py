"""Named groups of option names: where an option's value goes, and what a resume shares.

`SAMPLING_OPTIONS` and `OBJECT_OPTIONS` say how `JobConfig.from_options` reads an option;
`RESULT_OPTIONS`, `PLANNING_OPTIONS` and `RUN_OPTIONS` say what a checkpoint shares with the
run that resumes it (`JobConfig.result_options`, `JobConfig.planning_options`).
"""

# Options that become fields of the job's default SamplingParams.
SAMPLING_OPTIONS = (
    "n",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
)
# Options whose value is a JSON object (a TOML table).
OBJECT_OPTIONS = ("chat_template_kwargs",)
# Options a TOML config file may give as a table: the JSON objects, and adapters by name.
TABLE_OPTIONS = (*OBJECT_OPTIONS, "lora")

# What a checkpoint shares with the run that resumes it; every option is in exactly one of
# the three lists (a test checks it), so a new option must be placed deliberately.
# RESULT_OPTIONS define a row's result: a resume under other values is refused, naming them.
# The model is compared by its files (`jobs/output/identity.py`), not by its name, so it is
# absent here; `device` is compared by its kind (cpu, cuda), not its index.
# `attention_backend` is a result option as `dtype` is: another kernel sums in another order,
# so a row's bits (and a greedy near-tie) may change. Like `dtype`, it is compared as given:
# `auto` is `sdpa` whenever numerics are invariant, whatever is installed; only under
# `fast_numerics`, whose rows already move with their batch, may it pick another kernel on
# another machine.
RESULT_OPTIONS = (
    "device",
    # the row-parallel layers' partial sums are added in another order at another size
    "tensor_parallel_size",
    "dtype",
    "attention_backend",
    "fast_numerics",
    "revision",
    "max_model_len",
    "seed",
    "input_format",
    "prompt_column",
    "id_column",
    "keep_columns",
    # which images rows have, and which rows fail for too many or too large ones
    "image_column",
    "max_images_per_row",
    "max_image_pixels",
    "chat_template_kwargs",
    # which names body.model may give (other rows fail) and the name responses carry
    "served_model_name",
    # how a sample's text becomes content, tool calls and reasoning
    "tool_call_parser",
    "reasoning_parser",
    "task",
    "pooling",
    "normalize",
    "dimensions",
    *SAMPLING_OPTIONS,
)
# PLANNING_OPTIONS decide the windows and the prefix groups (the `prefix_group` column), not
# any row's completion. A job is planned once: a resumed run keeps the checkpoint's values
# (the engine still uses the page size given now for its KV pages).
PLANNING_OPTIONS = ("page_size", "grouping", "group_window")
# RUN_OPTIONS may change between runs: memory, sequence and token budgets, the prefix cache
# and the KV layout change which rows run together and where their KV lives, never a row's
# result; the rest is operation.
RUN_OPTIONS = (
    "model",
    "trust_remote_code",
    "threads",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_memory",
    "gpu_memory_utilization",
    "cuda_graphs",
    "prefix_cache",
    "kv_layout",
    "output_format",
    "save_tokens",
    "overwrite",
    "restart",
    "max_errors",
    "fail_on_row_errors",
    "checkpoint_rows",
    "checkpoint_seconds",
    "progress_seconds",
    "quiet",
    "summary_json",
    "executor",
    "ray_address",
    "workers",
    "worker_threads",
    "worker_gpus",
    # adapters are compared by their files' digests (`identity`), not by their paths
    "lora",
    "max_loras",
    "max_lora_rank",
    "tp_timeout",
)
