"""Every reduction along a row outside the GEMMs gives a row the same bits whatever rows
surround it: RMSNorm (the models' own modules), softmax, log-softmax and the cumulative sums
of top-p sampling, over the widths the engine runs (hidden sizes, vocabularies).

A reduction kernel could split one long row across threads when the tensor has few rows (a
different summation order than a row among many); these tests run at the thread count the
suite runs with, rows alone and inside 2 to 64 others, at first, middle and last position.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

COUNTS = (2, 3, 5, 12, 64)
WIDTHS = (64, 576, 300, 49152, 151936)


def row_ops():
    return {
        "softmax": lambda x: x.softmax(dim=-1),
        "softmax-float64": lambda x: torch.softmax(x, dim=-1, dtype=torch.float64),
        "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
        "cumsum-of-softmax": lambda x: x.softmax(dim=-1).cumsum(dim=-1),
        "cumsum-float64": lambda x: torch.softmax(x, dim=-1, dtype=torch.float64).cumsum_(dim=-1),
        "amax": lambda x: x.amax(dim=-1),
    }


def assert_row_alone_equals_row_in_crowd(op, width: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    row = torch.randn(1, width, generator=generator) * 4
    alone = op(row)[0]
    for count in COUNTS:
        for position in sorted({0, count // 2, count - 1}):
            crowd = torch.randn(count, width, generator=generator) * 4
            crowd[position] = row[0]
            got = op(crowd)[position]
            assert torch.equal(got, alone), f"seed {seed}: {count} rows, row at {position}"


@pytest.mark.parametrize("name", sorted(row_ops()))
@pytest.mark.parametrize("width", WIDTHS)
def test_row_reduction_ignores_other_rows(name, width):
    with torch.inference_mode():
        assert_row_alone_equals_row_in_crowd(row_ops()[name], width, seed=width)


@pytest.mark.parametrize("norm_class", [LlamaRMSNorm, Qwen2RMSNorm])
@pytest.mark.parametrize("hidden", [64, 576, 896])
def test_rms_norm_ignores_other_rows(norm_class, hidden):
    torch.manual_seed(hidden)
    norm = norm_class(hidden, eps=1e-5)
    norm.weight.data.normal_()
    with torch.inference_mode():
        # the model's shape: [1, tokens, hidden]
        assert_row_alone_equals_row_in_crowd(lambda x: norm(x[None])[0], hidden, seed=hidden)
