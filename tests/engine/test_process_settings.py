"""Process-wide settings the CLI applies: torch's CPU threads and glibc's allocator."""

from __future__ import annotations

import platform

import pytest
import torch

from astrai_batch.engine import keep_freed_memory, set_cpu_threads
from astrai_batch.engine.threads import available_cpus, describe_threads
from astrai_batch.errors import ConfigError


def test_set_cpu_threads_sets_and_reports_the_count():
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(1) == 1 == torch.get_num_threads()
        # None: one thread per CPU this process may use (affinity, cgroup quota)
        assert set_cpu_threads(None) == available_cpus() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", [0, -2, True, 1.5, "2"])
def test_set_cpu_threads_refuses_what_is_not_a_positive_int(value):
    with pytest.raises(ConfigError) as caught:
        set_cpu_threads(value)
    assert str(caught.value) == f"threads must be a positive int, got {value!r}"


def test_describe_threads():
    assert (describe_threads(1), describe_threads(2)) == ("1 CPU thread", "2 CPU threads")


def test_keep_freed_memory_applies_on_glibc_only():
    is_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is is_glibc
