"""An astrai-batch job as an Airflow task (Airflow 3, `pip install 'astrai-batch[airflow]'`).

`generate` runs `astrai-batch run` on the day's input into a dated output; its JSON summary is
the task's XCom return value, for the tasks after it. Killed (cleared, timed out) it saves its
finished rows, and the retry resumes them. Try it without a scheduler:

    airflow dags test astrai_batch_example -c '{"input_path": "/data/prompts.jsonl",
        "output_dir": "/data/out"}'

The jobs may run in another environment than Airflow's (one with torch): set
ASTRAI_BATCH_EXECUTABLE to its `astrai-batch` (default: the one on PATH).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from astrai_batch.airflow import AstraiBatchOperator

with DAG(
    dag_id="astrai_batch_example",
    schedule=None,  # e.g. "@daily"
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "input_path": "prompts.jsonl",
        "output_dir": "out",
        "model": "smollm2-135m",
        "max_tokens": 64,
        "threads": 4,
        "checkpoint_rows": 256,
    },
    default_args={
        "retries": 2,
        # the tests shorten it; a resumed job loses nothing by waiting
        "retry_delay": timedelta(seconds=float(os.environ.get("ASTRAI_EXAMPLE_RETRY_S", "60"))),
    },
    tags=["astrai-batch"],
) as dag:
    generate = AstraiBatchOperator(
        task_id="generate",
        input_path="{{ params.input_path }}",
        output_path="{{ params.output_dir }}/completions-{{ ds }}.parquet",
        options={
            "model": "{{ params.model }}",
            "max_tokens": "{{ params.max_tokens }}",
            "threads": "{{ params.threads }}",
            "checkpoint_rows": "{{ params.checkpoint_rows }}",
            "progress_seconds": 10,
        },
        executable=os.environ.get("ASTRAI_BATCH_EXECUTABLE", "astrai-batch"),
    )
