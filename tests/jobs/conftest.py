"""Fixtures of the job tests that need a service: one local Ray for every Ray test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_address():
    """A local Ray of 2 CPUs, started once for the session (no dashboard, loopback only)."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _node_ip_address="127.0.0.1",  # cluster traffic stays on loopback
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
