"""A job's options: the validated `JobConfig`, from flags or a TOML file, and value parsing.

Imports `engine.config`, `engine.sampling.params` and `io`; nothing that runs a job.
"""
