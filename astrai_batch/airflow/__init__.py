"""Airflow integration (the `airflow` extra): `AstraiBatchOperator` runs `astrai-batch run` as
a task. Nothing in the core imports this package; importing it needs no Airflow until the
operator itself is used (`run_options`, the CLI's option list, is plain Python)."""

from __future__ import annotations

from typing import Any

__all__ = ["AstraiBatchOperator"]


def __getattr__(name: str) -> Any:
    if name == "AstraiBatchOperator":
        from astrai_batch.airflow.operator import AstraiBatchOperator

        return AstraiBatchOperator
    raise AttributeError(name)
