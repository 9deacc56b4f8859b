"""Ray without its own lines on stderr: under either executor every line there is ours.

Ray writes to the driver's stderr from three places: its Python loggers (``ray``,
``ray.data``: a token-authentication WARNING at start, a "progress bars disabled" WARNING),
the C++ core worker in this process (``[... E ...] core_worker.cc`` lines, e.g. about actor
constructor arguments on every run) and the workers' output forwarded to the driver. The
first is silenced by handing Ray's loggers a null handler (``configure_logging=False``), the
second by ``RAY_BACKEND_LOG_LEVEL`` (read when the core worker starts, so set before
``ray.init``; the line announcing it goes to /dev/null with the rest of the start), the
third by ``log_to_driver=False``. Ray's real errors surface as exceptions,
reworded into one line (`ray_errors_in_one_line`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from astrai_batch import errors
from astrai_batch.errors import AstraiBatchError, ConfigError, ExecutorError
from astrai_batch.jobs.crash_points import CRASH_ENV
from astrai_batch.jobs.options.config import JobConfig

RAY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune", "ray.serve")
# Ray's own variables; a user's explicit setting wins.
QUIET_ENV = {"RAY_BACKEND_LOG_LEVEL": "fatal", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}


def silence_ray_loggers() -> None:
    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [logging.NullHandler()]
        logger.propagate = False
        logger.setLevel(logging.CRITICAL)


def start_ray(ray: Any, config: JobConfig) -> bool:
    """Connect to the cluster (or start a local one); True when this call started it."""
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    silence_ray_loggers()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
        "logging_level": logging.CRITICAL,
    }
    crash_at = os.environ.get(CRASH_ENV)
    if crash_at is not None:  # the fault-injection hook reaches the workers too
        options["runtime_env"] = {"env_vars": {CRASH_ENV: crash_at}}
    if config.ray_address is not None:
        options["address"] = config.ray_address
    else:
        # A cluster of our own, for this process only: its processes talk over loopback.
        options["_node_ip_address"] = "127.0.0.1"
    try:
        with _stderr_silenced():
            ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {config.ray_address}: {_first_line(exc)}"
        ) from exc
    silence_ray_loggers()  # ray.init may add handlers of its own
    return True


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null while Ray starts: its core worker announces the log
    level it read from the environment on stderr, before that level applies. Ray's start
    prints nothing of ours, and a failed start surfaces as an exception."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quiet_ray_data(ray: Any) -> None:
    """Ray Data's progress bars and execution banners off; its loggers silent."""
    import ray.data

    silence_ray_loggers()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    if hasattr(context, "enable_operator_progress_bars"):
        context.enable_operator_progress_bars = False


@contextlib.contextmanager
def ray_errors_in_one_line() -> Iterator[None]:
    """Ray's exceptions (a task's traceback, the cluster's state) as one line of ours."""
    try:
        yield
    except AstraiBatchError:
        raise
    except Exception as exc:
        if not type(exc).__module__.startswith("ray"):
            raise
        cause = getattr(exc, "cause", None)  # a plain task's exception, where Ray kept it
        if isinstance(cause, AstraiBatchError):
            raise cause from None
        name, message = _task_error(exc)
        ours = getattr(errors, name.removeprefix("astrai_batch.errors."), None)
        ours_type = isinstance(ours, type) and issubclass(ours, AstraiBatchError)
        if name.startswith("astrai_batch.errors.") and ours_type:  # raised in a Ray Data task
            raise ours(message) from None
        text = f"{name}: {message}" if name else message
        raise ExecutorError(f"the Ray executor failed: {text}") from None


_CHAINED = "The above exception was the direct cause of the following exception"


def _task_error(exc: BaseException) -> tuple[str, str]:
    """(the exception's qualified type name, its message) that a failed task raised, read
    from the traceback text Ray carries (a Ray Data task's exception object does not travel:
    only its text does); ("", Ray's first line) where the text has none."""
    first = str(exc).split(_CHAINED, 1)[0]
    for line in reversed(first.splitlines()):
        name, colon, message = line.partition(": ")
        named = all(part.isidentifier() for part in name.split("."))
        if colon and named and name.endswith(("Error", "Exception", "Exit")):
            return name, message.strip()
    return "", _first_line(exc)


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text (Ray's carry tracebacks)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
