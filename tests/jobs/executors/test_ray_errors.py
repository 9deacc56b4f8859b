"""A failed Ray task as one line of ours (`ray_quiet.ray_errors_in_one_line`): what the task
raised, not Ray's first line (which names only the task); our own errors as themselves."""

from __future__ import annotations

from array import array

import pytest

from astrai_batch.errors import ExecutorError, InputError
from astrai_batch.jobs.executors.ray_quiet import ray_errors_in_one_line


def overflows(batch):
    array("I", [-1])
    return batch


def raises_ours(batch):
    raise InputError("in.jsonl: line 3 is not JSON")


def test_a_failed_task_is_one_line_naming_what_it_raised(ray_address) -> None:
    import ray.data

    with pytest.raises(ExecutorError) as caught, ray_errors_in_one_line():
        ray.data.range(1).map_batches(overflows).materialize()
    assert str(caught.value) == (
        "the Ray executor failed: OverflowError: can't convert negative value to unsigned int"
    )


def test_our_error_in_a_task_is_raised_as_itself(ray_address) -> None:
    import ray.data

    with pytest.raises(InputError) as caught, ray_errors_in_one_line():
        ray.data.range(1).map_batches(raises_ours).materialize()
    assert str(caught.value) == "in.jsonl: line 3 is not JSON"
