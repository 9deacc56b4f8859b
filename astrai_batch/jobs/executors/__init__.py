"""Executors: where a job's planned rows become finished results.

Both implement `base.Executor` for the one job flow (`jobs.job`): `local` loads the model
and runs windows over one engine in this process (`local_executor`, `local_execution`); `ray` runs
prefix-aware shards on Ray workers through Ray Data (`ray_job`, `ray_stages`, `ray_worker`,
`shard_*`). Imports `output`, `planning`, `options` and the engine; never the job flow above.
"""
