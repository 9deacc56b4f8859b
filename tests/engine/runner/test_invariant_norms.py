"""Norms under invariant numerics on CUDA (`invariant_norms`), checked on the CPU: the
Llama-family RMSNorm with its mean from one Triton program per row (interpreted here), any
other norm on fixed-shape row tiles; a row's bits never depend on the rows beside it."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from torch import nn

from astrai_batch.engine.runner.invariant_norms import (
    LLAMA_RMSNORMS,
    RowMeanForward,
    TiledForward,
    set_norm_tiling,
)

triton = pytest.importorskip("triton")

from astrai_batch.engine.runner.norm_triton import mean_squares  # noqa: E402


def llama_norm(width=48):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(width, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width))
    return norm


def crowd_bits(forward, row, counts=(1, 2, 7, 16, 17, 300)):
    results = []
    for count in counts:
        for at in {0, count // 2, count - 1}:
            batch = torch.randn(count, row.shape[-1]) * 3
            batch[at] = row
            results.append(forward(batch)[at])
    return results


def test_mean_squares_is_each_rows_mean_of_squares():
    x = torch.randn(3, 5, 100, dtype=torch.float64).float()
    got = mean_squares(x)
    assert got.shape == (3, 5, 1)
    torch.testing.assert_close(got, x.double().pow(2).mean(-1, keepdim=True).float())


def test_the_llama_rmsnorm_row_ignores_its_neighbours_and_agrees_with_transformers():
    torch.manual_seed(0)
    norm = llama_norm()
    row = torch.randn(48)
    expected = norm(row[None])[0]
    set_norm_tiling(norm, True, mean_squares)
    assert isinstance(norm.__dict__["forward"], RowMeanForward)
    with torch.inference_mode():
        results = crowd_bits(norm, row)
    assert all(torch.equal(r, results[0]) for r in results)
    torch.testing.assert_close(results[0], expected, rtol=1e-6, atol=1e-6)


def test_other_norms_run_on_row_tiles_with_their_own_forward():
    torch.manual_seed(1)
    norm = nn.LayerNorm(40)
    row = torch.randn(40)
    expected = norm(row[None])[0]
    assert set_norm_tiling(norm, True, mean_squares, rows=8) == 1
    assert isinstance(norm.__dict__["forward"], TiledForward)
    with torch.inference_mode():
        results = crowd_bits(norm, row)
        three_d = norm(torch.stack([row, row, row]).view(1, 3, 40))
    assert all(torch.equal(r, results[0]) for r in results)
    assert torch.equal(results[0], expected.detach())  # the CPU's row sum: one thread per row
    assert three_d.shape == (1, 3, 40)


def test_swapped_and_restored_with_parameters_untouched():
    model = nn.Sequential(llama_norm(), nn.Linear(48, 48), nn.Sequential(nn.LayerNorm(48)))
    names = dict(model.named_parameters())
    assert set_norm_tiling(model, True, mean_squares) == 2
    assert set_norm_tiling(model, True, mean_squares) == 0  # already swapped
    assert dict(model.named_parameters()) == names
    assert set_norm_tiling(model, False) == 2
    assert "forward" not in model[0].__dict__ and "forward" not in model[2][0].__dict__
    assert set_norm_tiling(model, True) == 2  # without Triton: tiles for every norm
    assert isinstance(model[0].__dict__["forward"], TiledForward)


def test_the_llama_family_list_holds_llamas_forward_line_for_line():
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    reference = inspect.getsource(LlamaRMSNorm.forward)
    found = 0
    for model_type in importlib.import_module("astrai_batch.engine.model.support").__dict__[
        "SUPPORTED_MODEL_TYPES"
    ]:
        package = model_type_to_module_name(model_type)  # gemma3_text lives in gemma3
        module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
        for name, value in vars(module).items():
            if name in LLAMA_RMSNORMS and value.__module__ == module.__name__:
                assert inspect.getsource(value.forward) == reference, name
                found += 1
    assert found >= 10
