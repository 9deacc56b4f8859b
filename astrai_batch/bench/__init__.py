"""`astrai-batch bench`: throughput regression testing, with transformers measured alongside.

The command lives in `command` (registered on the CLI); `session.run_bench` runs one
benchmark; `results` holds the results Parquet schema; `baseline` the regression gate.
"""
