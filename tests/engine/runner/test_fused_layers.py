"""Fused Llama decoder layers on the CPU (`fused_layers`, `layer_kernels`): transformers'
bits from every C step, checked against transformers' own modules, or not used at all."""

from __future__ import annotations

import importlib
import inspect
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import build_tiny_tokenizer, tiny_config_kwargs
from hypothesis import given, settings
from hypothesis import strategies as st
from invariance_kit import assert_same_rows, invariance_prompts, mixed_requests, run_capturing
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)

from astrai_batch.engine import EngineConfig
from astrai_batch.engine.model.converted import cache_root
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.numerics.blas_rows import RowScheme
from astrai_batch.engine.numerics.packed_gemm import pack, packing_supported
from astrai_batch.engine.runner import fused_layers, layer_checks, merged_gemms
from astrai_batch.engine.runner.fused_layers import (
    SWITCH_ENV_VAR,
    FusedDecoderForward,
    set_fused_layers,
)
from astrai_batch.engine.runner.invariant_linear import RowTiledLinear
from astrai_batch.engine.runner.layer_checks import (
    activation_table,
    adversarial_hidden,
    every_bfloat16,
    norm_matches,
    rotary_matches,
)
from astrai_batch.engine.runner.layer_kernels import (
    LANES,
    PoolWrite,
    load_layer_kernels,
    takes_rows,
)

needs_packing = pytest.mark.skipif(
    not packing_supported(torch.bfloat16, torch.device("cpu")),
    reason="this torch packs no bfloat16 weights",
)


@pytest.fixture(scope="module")
def kernels():
    return load_layer_kernels(cache_root())


def _norm(width: int, eps: float = 1e-5, seed: int = 0) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(width, eps=eps).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width, generator=torch.Generator().manual_seed(seed)))
    return norm


@pytest.mark.parametrize("width", [64, 100, 576, 960, 2048, 4096])
def test_the_norm_has_transformers_bits_at_random_row_counts(kernels, width):
    """The vector width the check picks gives LlamaRMSNorm's bits, with and without the
    residual add before it, at row counts the check never saw."""
    norm = _norm(width, seed=width)
    lanes = norm_matches(kernels, norm)
    assert lanes in LANES
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    with torch.inference_mode():
        for rows in (rng.randrange(1, 700) for _ in range(4)):
            x = adversarial_hidden(rows, width, rng.randrange(1000))
            r = adversarial_hidden(rows, width, rng.randrange(1000))
            out, _ = kernels.rms_norm(x, norm.weight, norm.variance_epsilon, lanes)
            added, total = kernels.rms_norm(x, norm.weight, norm.variance_epsilon, lanes, add=r)
            assert torch.equal(out, norm(x)), f"seed {seed}, {rows} rows"
            assert torch.equal(total, r + x), f"seed {seed}, {rows} rows"
            assert torch.equal(added, norm(r + x)), f"seed {seed}, {rows} rows"


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(min_value=1, max_value=5000),
    rows=st.integers(min_value=1, max_value=40),
    eps=st.sampled_from([1e-6, 1e-5, 1e-3]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_the_norm_follows_torchs_sum_at_any_width(kernels, width, rows, eps, seed):
    """Widths with vector and scalar tails, past a cascade level (torch's multi_row_sum),
    any eps: the lanes the check picks give transformers' means and outputs."""
    norm = _norm(width, eps=eps, seed=seed)
    lanes = norm_matches(kernels, norm)
    assert lanes in LANES
    x = adversarial_hidden(rows, width, seed)
    with torch.inference_mode():
        assert torch.equal(kernels.mean_squares(x, lanes), x.float().pow(2).mean(-1))
        out, _ = kernels.rms_norm(x, norm.weight, norm.variance_epsilon, lanes)
        assert torch.equal(out, norm(x))


@pytest.mark.parametrize("width", range(1, 18))
def test_rows_narrower_than_a_vector_sum_as_torchs_scalar_loop(kernels, width):
    """Below a vector's width torch sums a row in its scalar loop (four interleaved partial
    sums from width 4 on): the check finds the kernel's bits there too, at 1 to 257 rows."""
    assert norm_matches(kernels, _norm(width, seed=width)) in LANES


def test_the_check_tells_summation_orders_apart(kernels):
    """Only one vector width reproduces torch's means: the others differ on most rows, so a
    kernel summing in another order is declined, not used."""
    x = adversarial_hidden(256, 576, 1)
    means = x.float().pow(2).mean(-1)
    differing = {lanes: int((kernels.mean_squares(x, lanes) != means).sum()) for lanes in LANES}
    assert sorted(differing.values())[0] == 0
    assert all(count > 50 for count in sorted(differing.values())[1:]), differing


def test_a_norm_with_other_arithmetic_is_declined(kernels):
    class HalfEpsNorm(LlamaRMSNorm):  # the mean plus eps / 2: one changed constant
        def forward(self, hidden_states):
            x = hidden_states.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon / 2)
            return self.weight * x.to(hidden_states.dtype)

    norm = HalfEpsNorm(576, eps=1e-1).bfloat16()
    assert norm_matches(kernels, _norm(576, eps=1e-1)) in LANES
    assert norm_matches(kernels, norm) == 0


@pytest.mark.parametrize("heads,dim", [((9, 3), 64), ((32, 8), 128), ((4, 4), 16)])
def test_the_rotary_embedding_has_transformers_bits(kernels, heads, dim):
    assert rotary_matches(kernels, apply_rotary_pos_emb, heads, dim)


def test_a_rotary_embedding_rounding_once_is_declined(kernels):
    """(q cos + rotate_half(q) sin) in float32, rounded once: closer to exact, and not what
    transformers computes, so the check must fail."""

    def rounded_once(q, k, cos, sin):
        def rot(x):
            half = x.shape[-1] // 2
            xf, c, s = x.float(), cos.float().unsqueeze(1), sin.float().unsqueeze(1)
            turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
            return (xf * c + turned * s).to(x.dtype)

        return rot(q), rot(k)

    assert not rotary_matches(kernels, rounded_once, (9, 3), 64)


def test_the_activation_table_gives_silu_times_up_at_every_value(kernels):
    table = activation_table(F.silu)
    assert table is not None
    gate = every_bfloat16().view(256, 256)
    up = torch.randn(256, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.inference_mode():
        got, want = kernels.act_mul(gate, up, table), F.silu(gate) * up
    same = got.view(torch.int16) == want.view(torch.int16)
    assert bool((same | (got.isnan() & want.isnan())).all())


def test_an_activation_that_depends_on_layout_gets_no_table():
    def by_layout(x):  # elementwise, but not the same on strided data
        return x * 2 if x.is_contiguous() else x * 3

    assert activation_table(by_layout) is None


def test_the_rotary_pass_writes_keys_and_values_as_index_copy(kernels):
    """The rotated keys and the values land in their pool slots as `index_copy_` puts them,
    on one thread and on two (64 tokens: the rotation's parallel size); a slot outside
    the pools raises with nothing written."""
    gen = torch.Generator().manual_seed(9)
    threads_before = torch.get_num_threads()
    for tokens, threads in ((5, 1), (64, 2)):
        torch.set_num_threads(threads)
        k_pool = torch.randn(200, 3, 16, generator=gen).bfloat16()
        v_pool = torch.randn(200, 3, 16, generator=gen).bfloat16()
        q = torch.randn(tokens, 9 * 16, generator=gen).bfloat16()
        keys = torch.randn(tokens, 3 * 16, generator=gen).bfloat16()
        values = torch.randn(1, tokens, 48, generator=gen).bfloat16()  # v_proj's rows
        cos, sin = (torch.randn(tokens, 16, generator=gen).bfloat16() for _ in range(2))
        slots = torch.randperm(200, generator=gen)[:tokens]
        q_alone, k_alone = kernels.rotary(q, keys, cos, sin, 16)
        want_k = k_pool.clone().index_copy_(0, slots, k_alone)
        want_v = v_pool.clone().index_copy_(0, slots, values.reshape(tokens, 3, 16))
        pools = PoolWrite(k_pool, v_pool, slots, values)
        q_out, k_out = kernels.rotary(q, keys, cos, sin, 16, pools)
        assert torch.equal(q_out, q_alone) and torch.equal(k_out, k_alone)
        assert torch.equal(k_pool, want_k) and torch.equal(v_pool, want_v)
        outside = slots.clone()
        outside[-1] = 200
        before = k_pool.clone(), v_pool.clone()
        with pytest.raises(IndexError, match="a step's write slot lies outside the KV pool"):
            kernels.rotary(q, keys, cos, sin, 16, PoolWrite(k_pool, v_pool, outside, values))
        assert torch.equal(k_pool, before[0]) and torch.equal(v_pool, before[1])
    torch.set_num_threads(threads_before)
    with pytest.raises(ValueError, match="the KV pools cannot take this step's rows"):
        kernels.rotary(q, keys, cos, sin, 16, PoolWrite(k_pool.float(), v_pool, slots, values))
    assert not takes_rows(v_pool.float(), values, slots)
    assert not takes_rows(v_pool, values, slots.int())
    assert not takes_rows(v_pool, values[:, :4], slots)


def _tiny_layer() -> LlamaDecoderLayer:
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=64,
    )
    return LlamaDecoderLayer(config, layer_idx=0).bfloat16()


def _layer_inputs(batch: int, tokens: int, seed: int):
    """Hidden states [batch, tokens, 64] for `_tiny_layer` and its rotary (cos, sin), one
    row of angles broadcast over the batch as transformers' default positions give."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, 64, generator=gen).bfloat16()
    angles = torch.rand(1, tokens, 8, generator=gen) * 7
    angles = torch.cat((angles, angles), dim=-1)
    return hidden, (angles.cos().bfloat16(), angles.sin().bfloat16())


def test_only_llamas_own_layer_classes_are_fused(kernels):
    memo = {("layer kernels",): kernels}
    layer = _tiny_layer()
    renamed = type("MyDecoderLayer", (LlamaDecoderLayer,), {})  # may change anything
    other = _tiny_layer()
    other.__class__ = renamed
    model = torch.nn.ModuleList([layer, other])
    assert set_fused_layers(model, True, memo) == 1
    assert isinstance(layer.__dict__["forward"], FusedDecoderForward)
    assert "forward" not in other.__dict__
    assert set_fused_layers(model, False, memo) == 1
    assert "forward" not in layer.__dict__


@pytest.mark.parametrize("implementation,batch", [("sdpa", 1), ("eager", 1), ("sdpa", 3)])
def test_a_fused_layer_follows_the_models_attention_implementation(kernels, implementation, batch):
    """A peer may switch the model to transformers' own attention (bench, references), and
    run a batch of rows whose rotary angles broadcast: the fused forward then calls that
    attention and computes what transformers' forward does."""
    layer = _tiny_layer()
    layer.self_attn.config._attn_implementation = implementation
    hidden, embeddings = _layer_inputs(batch, 7, seed=11)
    with torch.inference_mode():
        expected = layer(hidden, position_embeddings=embeddings)
        assert set_fused_layers(torch.nn.ModuleList([layer]), True, {("layer kernels",): kernels})
        assert torch.equal(layer(hidden, position_embeddings=embeddings), expected)


def test_calls_the_c_steps_cannot_serve_run_transformers_forward(kernels):
    """A transformers cache, gradients, float32 states: the fused forward hands the call to
    transformers' own, unchanged."""
    from transformers import DynamicCache

    layer = _tiny_layer()
    layer.self_attn.config._attn_implementation = "sdpa"
    hidden, embeddings = _layer_inputs(1, 5, seed=12)
    with torch.inference_mode():
        cached = layer(hidden, position_embeddings=embeddings, cache=DynamicCache())
    assert set_fused_layers(torch.nn.ModuleList([layer]), True, {("layer kernels",): kernels})
    with torch.inference_mode():
        again = layer(hidden, position_embeddings=embeddings, cache=DynamicCache())
    assert torch.equal(again, cached)
    with torch.enable_grad():
        layer(hidden, position_embeddings=embeddings).float().sum().backward()
    # the gradient reaches the first norm: autograd ran through transformers' operators
    assert layer.input_layernorm.weight.grad is not None
    with pytest.raises(ValueError, match="the CPU norm kernel needs CPU bfloat16 tensors"):
        kernels.rms_norm(hidden.float(), layer.input_layernorm.weight, 1e-5, 8)


def test_a_remote_class_of_the_same_name_is_not_fused(kernels):
    """trust_remote_code models may define their own `LlamaDecoderLayer`: only transformers'
    own modeling files' classes are fused."""
    remote = type("LlamaDecoderLayer", (LlamaDecoderLayer,), {"__module__": "remote_llama"})
    layer = _tiny_layer()
    layer.__class__ = remote
    assert set_fused_layers(torch.nn.ModuleList([layer]), True, {("layer kernels",): kernels}) == 0


def test_a_layer_whose_norm_does_not_match_is_left_alone(kernels, monkeypatch):
    monkeypatch.setattr(layer_checks, "norm_matches", lambda kernels, norm: 0)
    model = torch.nn.ModuleList([_tiny_layer()])
    assert set_fused_layers(model, True, {("layer kernels",): kernels}) == 0


def _fused_count(loaded) -> int:
    return sum(
        isinstance(m.__dict__.get("forward"), FusedDecoderForward) for m in loaded.model.modules()
    )


def _body(function) -> list[str]:
    """A function's source lines after its signature, stripped."""
    lines = [line.strip() for line in inspect.getsource(function).splitlines()]
    return lines[next(i for i, line in enumerate(lines) if line.endswith(":")) + 1 :]


@pytest.mark.parametrize("layer_class", sorted(fused_layers.FAMILIES))
def test_each_family_runs_llamas_forwards_line_for_line(layer_class):
    """What `FusedDecoderForward` mirrors: the listed layers' and MLPs' forwards are Llama's,
    their attention's Llama's but for the sliding window passed (a transformers upgrade that
    changes one fails here, not in a user's tokens)."""
    family = fused_layers.FAMILIES[layer_class]
    prefix = layer_class.removesuffix("DecoderLayer")
    module = importlib.import_module(
        f"transformers.models.{prefix.lower()}.modeling_{prefix.lower()}"
    )
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    assert _body(getattr(module, layer_class).forward) == _body(llama.LlamaDecoderLayer.forward)
    mlp = getattr(module, f"{prefix}MLP")
    assert mlp.__name__ in fused_layers.FUSABLE_MLPS
    assert _body(mlp.forward) == _body(llama.LlamaMLP.forward)
    attention = _body(getattr(module, family.attention).forward)
    window_lines = [line for line in attention if line.startswith("sliding_window=")]
    assert len(window_lines) == (0 if family.window is None else 1)
    assert [line for line in attention if line not in window_lines] == _body(
        llama.LlamaAttention.forward
    )
    if window_lines:  # the family's window is the expression transformers passes
        config = getattr(module, f"{prefix}Config")(
            hidden_size=8,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_hidden_layers=1,
            sliding_window=16,
            use_sliding_window=True,
            max_window_layers=0,
            layer_types=["sliding_attention"],
        )
        attn = getattr(module, family.attention)(config, 0)
        expression = window_lines[0].removeprefix("sliding_window=").split("#")[0].rstrip(", ")
        assert eval(expression, {"getattr": getattr}, {"self": attn}) == 16
        assert family.window(attn) == 16


def _assert_fusing_changes_nothing(loaded, seed: int, counted, expected: int, monkeypatch):
    """Tokens and logits of 6 mixed requests, fused (`counted(loaded) == expected`) and with
    fusing switched off, under both numerics."""
    prompts = invariance_prompts(loaded.model.config.vocab_size, 6, seed=seed)
    for numerics in ("invariant", "fast"):
        config = EngineConfig(page_size=8, num_pages=128, numerics=numerics)
        fused, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
        assert counted(loaded) == expected
        monkeypatch.setenv(SWITCH_ENV_VAR, "0")
        plain, _ = run_capturing(loaded, mixed_requests(prompts, range(6)), config)
        assert _fused_count(loaded) == 0
        monkeypatch.delenv(SWITCH_ENV_VAR)
        assert_same_rows(plain, fused, range(6))


def test_fused_layers_change_no_token_or_logit(tiny_model_dir, monkeypatch):
    loaded = load_model(tiny_model_dir, dtype="bfloat16")
    layers = loaded.model.config.num_hidden_layers
    _assert_fusing_changes_nothing(loaded, 6, _fused_count, layers, monkeypatch)


@pytest.fixture(scope="module")
def wide_llama_dir(tmp_path_factory):
    """A tiny Llama whose projections all pack (hidden 128: 64-column ones do not here), so
    its q/k/v and gate/up run merged."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tiny_tokenizer()
    kwargs = {**tiny_config_kwargs(tokenizer), "hidden_size": 128, "intermediate_size": 256}
    torch.manual_seed(77)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**kwargs), dtype=torch.float32)
    path = tmp_path_factory.mktemp("wide-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _merged_count(loaded) -> int:
    layers = [m.__dict__.get("forward") for m in loaded.model.modules()]
    fused = [f for f in layers if isinstance(f, FusedDecoderForward)]
    return sum((f.qkv is not None) + (f.gate_up is not None) for f in fused)


@needs_packing
def test_merged_projections_change_no_token_or_logit(wide_llama_dir, monkeypatch):
    loaded = load_model(wide_llama_dir, dtype="bfloat16")
    layers = loaded.model.config.num_hidden_layers
    _assert_fusing_changes_nothing(loaded, 8, _merged_count, 2 * layers, monkeypatch)


@needs_packing
def test_a_merge_is_checked_and_declined_where_columns_differ(monkeypatch):
    """The merged GEMM's columns equal each layer's F.linear at the sampled row counts, and a
    GEMM that changes one element at one row count is declined."""
    assert merged_gemms.merged_matches(576, (576, 192, 192), False)
    assert merged_gemms.merged_matches(128, (128, 64), True)
    real = merged_gemms.packed_gemm

    def off_at_seven_rows(rows, packed, bias):
        out = real(rows, packed, bias)
        if rows.shape[0] == 7:
            out[3, -1] = out[3, -1] + 1
        return out

    monkeypatch.setattr(merged_gemms, "packed_gemm", off_at_seven_rows)
    assert not merged_gemms.merged_matches(128, (128, 64), False)


@needs_packing
def test_a_merge_needs_packed_layers_on_one_scheme_and_follows_them():
    linears = [torch.nn.Linear(128, n, bias=False).bfloat16() for n in (128, 64, 64)]
    tiled = tuple(RowTiledLinear(m, RowScheme.whole()) for m in linears)
    memo: dict = {}
    assert merged_gemms.merged_gemm(tiled, memo) is None  # not packed
    for layer in tiled:
        layer._packed = pack(layer.weight.detach())
    merged = merged_gemms.merged_gemm(tiled, memo)
    assert merged is not None and merged.sizes == (128, 64, 64)
    x = torch.randn(2, 5, 128).bfloat16()
    with torch.inference_mode():
        for part, layer in zip(merged.run(x), tiled, strict=True):
            assert torch.equal(part, layer(x))
    assert merged.applies(tiled)
    assert not merged.applies((tiled[0], tiled[1], RowTiledLinear(linears[2], RowScheme.whole())))
    assert merged_gemms.merged_gemm(tiled, memo).packed is merged.packed  # the copy is kept
    other = RowTiledLinear(linears[1], RowScheme.tiles(16))
    other._packed = tiled[1]._packed
    assert merged_gemms.merged_gemm((tiled[0], other), memo) is None  # two schemes


@needs_packing
def test_a_merge_runs_any_row_count_as_its_layers_scheme_does():
    """Past one GEMM's rows (a prefill chunk) the merge runs the layers' tiles and their
    zero-padded remainder: each layer's bits at every row count."""
    scheme = RowScheme(min_rows=3, max_rows=4, pad_to=(0, 3, 3))
    linears = [torch.nn.Linear(128, n, bias=True).bfloat16() for n in (128, 64)]
    tiled = tuple(RowTiledLinear(m, scheme) for m in linears)
    for layer in tiled:
        layer._packed = pack(layer.weight.detach())
    merged = merged_gemms.merged_gemm(tiled, {})
    assert merged is not None and merged.scheme == scheme
    generator = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for n in range(1, 14):
            x = torch.randn(n, 128, generator=generator).bfloat16()
            for part, layer in zip(merged.run(x), tiled, strict=True):
                assert torch.equal(part, layer(x)), n


def test_float32_models_are_not_fused(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir, dtype="float32")
    prompts = invariance_prompts(loaded.model.config.vocab_size, 2, seed=7)
    run_capturing(loaded, mixed_requests(prompts, range(2)), EngineConfig(page_size=8))
    assert _fused_count(loaded) == 0
