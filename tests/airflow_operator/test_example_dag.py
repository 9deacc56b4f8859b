"""The example DAG (examples/airflow) under a real Airflow 3: `airflow dags test` with a
sqlite metadata DB in a temporary AIRFLOW_HOME. A good input succeeds with the job's summary
as the task's XCom; a broken input fails the DAG run (no retry: it would fail the same); a run
killed part-way (SIGTERM to the task, as Airflow sends on a clear or a timeout) is retried and
resumes from its checkpoint, writing what an uninterrupted run writes; an unknown option fails
the DAG's import.

Long suite: `scripts/test-airflow` installs Airflow into its own venv (ASTRAI_AIRFLOW_VENV)
and runs these; skipped without it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from jobs.jobkit import REPO_ROOT, comparable, run_cli, saved_parts, shared_prefix_prompts
from jobs.jobkit import write_jsonl as write_lines

pytestmark = pytest.mark.long

VENV = os.environ.get("ASTRAI_AIRFLOW_VENV", "")
AIRFLOW = Path(VENV) / "bin" / "airflow"
DAG_ID = "astrai_batch_example"
EXAMPLES = REPO_ROOT / "examples" / "airflow"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not AIRFLOW.exists():
        pytest.skip("no Airflow: scripts/test-airflow installs it (ASTRAI_AIRFLOW_VENV)")
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(EXAMPLES),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "PYTHONPATH": str(REPO_ROOT),
        # the jobs run in this venv (torch); Airflow in its own
        "ASTRAI_BATCH_EXECUTABLE": str(Path(sys.executable).with_name("astrai-batch")),
        "ASTRAI_EXAMPLE_RETRY_S": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True)
    return {"env": env, "db": home / "airflow.db"}


def dags_test(
    airflow: dict[str, Any], conf: dict[str, Any], while_running: Any = None
) -> tuple[int, str]:
    """`airflow dags test` of the example with `conf`; `while_running(process)` is called in a
    thread meanwhile. Returns the exit code and the log."""
    process = subprocess.Popen(
        [AIRFLOW, "dags", "test", DAG_ID, "-c", json.dumps(conf)],
        env=airflow["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if while_running is not None:
        threading.Thread(target=while_running, args=(process,), daemon=True).start()
    log, _ = process.communicate(timeout=600)
    return process.returncode, log


def last_run(airflow: dict[str, Any]) -> dict[str, Any]:
    """The latest DAG run's state, its task's state and tries, and its XComs."""
    with sqlite3.connect(airflow["db"]) as db:
        run_id, state = db.execute(
            "SELECT run_id, state FROM dag_run ORDER BY id DESC LIMIT 1"
        ).fetchone()
        task_state, tries = db.execute(
            "SELECT state, try_number FROM task_instance WHERE run_id = ? AND task_id = ?",
            (run_id, "generate"),
        ).fetchone()
        xcoms = {
            key: json.loads(value)
            for key, value in db.execute(
                "SELECT key, value FROM xcom WHERE run_id = ? AND task_id = ?",
                (run_id, "generate"),
            )
        }
    return {"state": state, "task_state": task_state, "tries": tries, "xcom": xcoms}


def conf_for(model_dir: Path, source: Path, out_dir: Path, **more: Any) -> dict[str, Any]:
    out_dir.mkdir(exist_ok=True)
    return {
        "input_path": str(source),
        "output_dir": str(out_dir),
        "model": str(model_dir),
        "max_tokens": 6,
        "threads": 1,
        "checkpoint_rows": 8,
        **more,
    }


def prompts(count: int) -> list[dict[str, Any]]:
    return [{"id": f"r{i}", "prompt": p} for i, p in enumerate(shared_prefix_prompts(count))]


def test_a_good_input_succeeds_with_its_summary_as_xcom(airflow, tiny_llama_dir, tmp_path):
    source = write_lines(tmp_path / "in.jsonl", prompts(24))
    code, log = dags_test(airflow, conf_for(tiny_llama_dir, source, tmp_path / "out"))
    run = last_run(airflow)
    assert code == 0, log[-3000:]
    assert (run["state"], run["task_state"], run["tries"]) == ("success", "success", 1)
    summary = run["xcom"]["return_value"]
    assert summary["status"] == "completed" and summary["rows"] == 24
    (output,) = (tmp_path / "out").glob("completions-????-??-??.parquet")
    assert summary["output"] == str(output)
    assert len(comparable(output)) == 24
    # the job's progress lines reached the task log as they came
    assert "astrai-batch: 24/24 rows (100.0%)" in log
    assert f"--model {tiny_llama_dir} --max-tokens 6 --threads 1 --checkpoint-rows 8" in log


def test_a_broken_input_fails_the_dag_run(airflow, tiny_llama_dir, tmp_path):
    broken = [{"id": f"b{i}", "messages": "not a list"} for i in range(5)]
    source = write_lines(tmp_path / "broken.jsonl", broken)
    code, log = dags_test(airflow, conf_for(tiny_llama_dir, source, tmp_path / "out"))
    run = last_run(airflow)
    assert (run["state"], run["task_state"]) == ("failed", "failed"), log[-3000:]
    assert code == 1  # `dags test` reports the failed run
    assert run["tries"] == 1  # every row failed: a retry would too
    assert run["xcom"]["summary"]["status"] == "failed"
    assert "return_value" not in run["xcom"]
    assert "astrai-batch exited with 1 (failed): all 5 rows failed" in log


def test_a_killed_task_is_retried_and_resumes(airflow, tiny_llama_dir, tmp_path):
    rows = 160
    source = write_lines(tmp_path / "in.jsonl", prompts(rows))
    out_dir = tmp_path / "out"
    conf = conf_for(tiny_llama_dir, source, out_dir, max_tokens=12)
    killed = threading.Event()

    def kill_part_way(process: subprocess.Popen[str]) -> None:
        """SIGTERM to the task's process (in `dags test`, the command's own) once the job
        saved three parts, as Airflow's supervisor signals a task it stops."""
        deadline = time.monotonic() + 300
        while process.poll() is None and time.monotonic() < deadline:
            checkpoints = list(out_dir.glob(".completions-*.parquet.ckpt"))
            if checkpoints and saved_parts(checkpoints[0]) >= 3:
                process.send_signal(signal.SIGTERM)
                killed.set()
                return
            time.sleep(0.05)

    _, log = dags_test(airflow, conf, kill_part_way)
    assert killed.is_set(), log[-3000:]
    run = last_run(airflow)
    assert (run["state"], run["task_state"], run["tries"]) == ("success", "success", 2), log[-4000:]
    assert "sending SIGTERM to the job" in log
    assert "astrai-batch exited with 143 (interrupted)" in log
    assert "a retry resumes from the checkpoint" in log
    summary = run["xcom"]["return_value"]
    assert summary["status"] == "completed"
    assert 0 < summary["resumed_rows"] < rows and summary["rows_done"] == rows
    # what an uninterrupted run of the same job writes
    (output,) = out_dir.glob("completions-????-??-??.parquet")
    reference = tmp_path / "reference.parquet"
    result = run_cli(
        "run", source, reference, "--model", tiny_llama_dir, "--max-tokens", "12",
        "--threads", "1", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert comparable(output) == comparable(reference)


def test_an_unknown_option_fails_the_dag_import(airflow, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    text = (EXAMPLES / "astrai_batch_dag.py").read_text()
    assert '"max_tokens": "{{ params.max_tokens }}"' in text
    typo = text.replace('"max_tokens": "{{', '"max_token": "{{')
    (dags / "typo_dag.py").write_text(typo)
    code = (
        "import json, sys; from airflow.dag_processing.dagbag import DagBag; "
        "bag = DagBag(sys.argv[1]); "
        "print(json.dumps({'dags': sorted(bag.dag_ids), 'errors': bag.import_errors}))"
    )
    out = subprocess.run(
        [Path(VENV) / "bin" / "python", "-c", code, str(dags)],
        env=airflow["env"],
        capture_output=True,
        text=True,
        check=True,
    )
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed["dags"] == []
    (error,) = parsed["errors"].values()
    assert (
        "AstraiBatchOperator 'generate': unknown option 'max_token' (did you mean "
        "'max_tokens'?)" in error
    )
