"""The device check's bookkeeping: each step's verdict, figures and time as one JSON file.

A step is a function returning its figures with a boolean `passed`. A step that raises, or
returns no boolean verdict, has failed (a promise nobody judged is not kept); the error or
the missing verdict is written in its file. Each file is written as soon as the step is done,
so a check cut short by a time limit keeps what it finished.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class CheckRun:
    """Steps run in order on one device; `summary()` judges them all."""

    def __init__(
        self, out_dir: Path, device: torch.device, log: Callable[[str], None], time_limit: float
    ) -> None:
        self.out_dir = out_dir
        self.device = device
        self.log = log
        self.time_limit = time_limit
        self.verdicts: dict[str, bool] = {}
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()
        out_dir.mkdir(parents=True, exist_ok=True)

    def step(self, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self.log(f"gpu_check: {name} ...")
        began = time.perf_counter()
        reset_peak(self.device)
        try:
            result = body()
        except Exception as exc:  # one broken step must not hide the others' verdicts
            result = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
            result["traceback"] = traceback.format_exc()
        verdict = result.get("passed")
        if not isinstance(verdict, bool):
            result["passed"] = False
            result["verdict"] = f"missing (the step returned passed={verdict!r})"
        result["seconds"] = round(time.perf_counter() - began, 3)
        result["peak_device_memory_bytes"] = peak(self.device)
        write_json(self.out_dir / f"{name}.json", result)
        self.verdicts[name] = result["passed"]
        self.seconds[name] = result["seconds"]
        word = "passed" if result["passed"] else "FAILED"
        self.log(f"gpu_check: {name} {word} in {result['seconds']} s")
        return result

    def summary(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started
        in_time = elapsed <= self.time_limit  # unrounded: a fast run is not 0.0 s
        seconds = round(elapsed, 3)
        failed = [name for name, ok in self.verdicts.items() if not ok]
        summary = {
            "device": str(self.device),
            "steps": {
                name: {"passed": ok, "seconds": self.seconds[name]}
                for name, ok in self.verdicts.items()
            },
            "failed": failed + ([] if in_time else ["time_limit"]),
            "seconds": seconds,
            "time_limit_seconds": self.time_limit,
            "passed": not failed and in_time,
        }
        write_json(self.out_dir / "summary.json", summary)
        return summary


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def write_json(path: Path, value: dict) -> None:
    temp = path.with_suffix(".json.tmp")
    temp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temp.replace(path)
