"""The roofline line: a run's weight-GEMM FLOPs counted from the model's own shapes."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_batch.bench.roofline import GemmPeak, Roofline, body_and_head, gemm_peak, roofline
from astrai_batch.bench.runs import EngineFigures, SystemRun
from astrai_batch.engine.model.loader import load_model


def test_flops_count_every_computed_token_through_the_body_and_sampled_rows_through_the_head(
    tiny_llama_dir,
):
    model = load_model(tiny_llama_dir).model
    body, head = body_and_head(model)
    # 2 layers of q, k, v, o (64x64, 64x32 twice, 64x64) and gate, up, down (64x128 x2, 128x64)
    assert sorted(body) == sorted(
        [(64, 64), (64, 32), (64, 32), (64, 64)] * 2 + [(64, 128), (64, 128), (128, 64)] * 2
    )
    assert head == model.config.vocab_size * 64
    figures = EngineFigures(
        prefill_tokens=100,
        cache_hit_rate=0.5,
        ttft_p50_seconds=0.1,
        ttft_p90_seconds=0.2,
        peak_kv_pages=1,
        kv_pool_pages=2,
        kv_layout="paged",
        attention_backend="sdpa",
        kv_seats=None,
        peak_running_seqs=4,
        forward_seconds=1.5,
        step_seconds=1.8,
        steps=9,
        preemptions=0,
    )
    run = SystemRun("astrai", 0, 2.0, 120, 16, None, json.dumps({}), figures)
    line = roofline(model, run, peak=1e9, prompts=4)
    per_token = 2 * sum(k * n for k, n in body)
    assert line.gemm_flops == per_token * (100 + 16 - 4) + 2 * head * 16
    assert line.floor_seconds == line.gemm_flops / 1e9
    assert line.line().endswith(", 25% of wall outside the forward")


def test_the_peak_is_a_positive_rate_in_the_model_dtype(tiny_llama_dir):
    model = load_model(tiny_llama_dir, dtype="bfloat16").model
    assert gemm_peak(model) > 0
    assert Roofline(2e9, 1e9, 4.0, None).line() == (
        "roofline: 0.00 TFLOP of weight GEMMs at a measured peak of 1 GFLOP/s = GEMM floor "
        "2.00 s; wall 4.00 s = 2.00x the floor"
    )
    assert torch.get_num_threads() >= 1


def test_the_peak_measured_again_is_priced_at_the_highest_measurement(tiny_llama_dir):
    model = load_model(tiny_llama_dir, dtype="bfloat16").model
    with GemmPeak(model) as peak:
        with pytest.raises(ValueError, match="not been measured yet"):
            _ = peak.best
        first = peak.measure()
        assert peak.describe() == f"{first / 1e9:,.0f} GFLOP/s"
        second = peak.measure()
        third = peak.measure()
    assert peak.measurements == [first, second, third] and min(peak.measurements) > 0
    assert peak.best == max(first, second, third)
    each = ", ".join(f"{m / 1e9:,.0f}" for m in (first, second, third))
    assert peak.describe() == f"{peak.best / 1e9:,.0f} GFLOP/s (the highest of {each})"
