"""`AstraiBatchOperator`: one `astrai-batch run` as an Airflow task.

The job runs as a child process (its memory, threads and torch stay out of the worker); its
stderr progress lines go to the task log as they come, its JSON summary (stdout's last line)
becomes the task's XCom return value. Exit codes follow the CLI's table: 0 succeeds; 130 / 143
(interrupted: the checkpoint is kept) and 1 without a summary (the job could not start or
broke) fail the task so that Airflow's retries rerun it, which resumes; 2 (usage), 3 (rows
failed with fail_on_row_errors) and a summary saying `failed` or `aborted` fail it for good
(`AirflowFailException`: a retry would only do the same again).

When Airflow kills the task (cleared, marked, timed out), `on_kill` sends the job SIGTERM and
waits for it to save its finished rows (`kill_grace_seconds`), so the retry resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from astrai_batch.airflow.run_options import (
    OptionError,
    check_options,
    command_arguments,
    load_spec,
)

RETRYABLE_EXIT_CODES = (1, 130, 143)


class AstraiBatchOperator(BaseOperator):
    """Run `astrai-batch run INPUT OUTPUT` with `options` (the run command's options named as
    in its TOML config: `{"model": "...", "max_tokens": 64, "task": "score"}`).

    `input_path`, `output_path` and `options` are templated (`{{ ds }}` works). An unknown
    option or a value the CLI would refuse fails the DAG's import. `executable` is the
    `astrai-batch` command of the environment the jobs run in (a path, or a list such as
    `["/opt/jobs/bin/python", "-m", "astrai_batch.cli"]`); `env` is added to the worker's
    environment for the job.
    """

    template_fields: Sequence[str] = ("input_path", "output_path", "options")
    ui_color = "#dbe9ff"

    def __init__(
        self,
        *,
        input_path: str,
        output_path: str,
        options: Mapping[str, Any] | None = None,
        executable: str | Sequence[str] = "astrai-batch",
        env: Mapping[str, str] | None = None,
        kill_grace_seconds: float = 120.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._spec = load_spec()
        try:
            self.options = check_options(options or {}, self._spec, rendered=False)
        except OptionError as exc:
            raise ValueError(f"AstraiBatchOperator {kwargs.get('task_id')!r}: {exc}") from None
        self.input_path = input_path
        self.output_path = output_path
        self.executable = [executable] if isinstance(executable, str) else list(executable)
        self.env = dict(env or {})
        self.kill_grace_seconds = kill_grace_seconds
        self._process: subprocess.Popen[str] | None = None

    def command(self) -> list[str]:
        """The job's command line, from the rendered fields."""
        try:
            options = check_options(self.options, self._spec, rendered=True)
        except OptionError as exc:
            raise AirflowFailException(f"after rendering: {exc}") from None
        arguments = command_arguments(options, self._spec)
        return [*self.executable, "run", str(self.input_path), str(self.output_path), *arguments]

    def execute(self, context: Any) -> dict[str, Any]:
        command = self.command()
        self.log.info("running %s", " ".join(command))
        stdout: list[str] = []
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env={**os.environ, **self.env},
            start_new_session=True,  # signals reach the job only through on_kill
        )
        self._process = process
        reader = threading.Thread(target=lambda: stdout.extend(process.stdout or ()), daemon=True)
        reader.start()
        last_line = ""
        try:
            for line in process.stderr or ():
                line = line.rstrip("\n")
                if line.strip():
                    last_line = line.removeprefix("Error: ")  # click's one-line errors
                    self.log.info("%s", line)
            code = process.wait()
            reader.join()
        finally:
            if process.poll() is None:  # execute itself was interrupted (a timeout)
                self._stop(process)
        summary = _summary(stdout)
        if code == 0 and summary is not None:
            return summary
        if summary is not None:
            context["ti"].xcom_push(key="summary", value=summary)
        raise _failure(code, summary, last_line)

    def on_kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            self.log.info("sending SIGTERM to the job (pid %d): it saves its rows", process.pid)
            self._stop(process)

    def _stop(self, process: subprocess.Popen[str]) -> None:
        """SIGTERM, then SIGKILL if the job has not saved and exited in the grace time."""
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=self.kill_grace_seconds)
        except subprocess.TimeoutExpired:
            self.log.warning("the job did not stop in %.0f s: killing it", self.kill_grace_seconds)
            process.kill()
            process.wait()
        except ProcessLookupError:
            pass


def _failure(code: int, summary: dict[str, Any] | None, last_line: str) -> AirflowException:
    """What a failed exit raises: retryable unless a rerun can only do the same again."""
    status = summary.get("status") if summary else None
    message = (summary or {}).get("message") or last_line or "no message"
    text = f"astrai-batch exited with {code}" + (f" ({status})" if status else "")
    text += f": {message}"
    if code in (130, 143):
        return AirflowException(f"{text}; a retry resumes from the checkpoint")
    if code in RETRYABLE_EXIT_CODES and status not in ("failed", "aborted"):
        return AirflowException(text)
    return AirflowFailException(text)


def _summary(stdout: list[str]) -> dict[str, Any] | None:
    """The JSON summary: the last line of stdout that parses as an object."""
    for line in reversed(stdout):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "status" in value:
            return value
    return None
