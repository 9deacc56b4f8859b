"""The kernel path of the runner: metadata-driven attention equals the SDPA path.

On CPU the kernels are pure-torch references that find every key through the kernels'
metadata only (`paged_kernel_reference`): their attention output, layer by layer, must
equal the SDPA path's for the same step, and the engine run through them must give
transformers' greedy tokens. On CUDA, with FlashInfer or flash-attn installed, the real
kernels are compared with the SDPA path the same way (skipped elsewhere).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from engine_reference import hf_greedy, mixed_prompts
from paged_kernel_reference import BlockTableReference, CsrReference
from transformers import AutoModelForCausalLM

from astrai_batch.cache import KVPool
from astrai_batch.engine.attention.kernels.factory import make_kernel
from astrai_batch.engine.attention.paged_attention import BATCH_KWARG, paged_attention
from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.runner.model_runner import ModelRunner
from astrai_batch.engine.runner.scheduled_chunk import ScheduledChunk
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.types import GenerationRequest

PAGE = 4


def model_and_pool(model_dir, *, dtype=torch.float32, device="cpu", page=PAGE, pages=128):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    config = model.config
    pool = KVPool(
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        page_size=page,
        num_pages=pages,
        dtype=dtype,
        device=device,
    )
    return model, pool


def step_attention(runner: ModelRunner, chunks, seed: int = 0) -> list[torch.Tensor]:
    """Each layer's attention for the step, [T, Hq, D], from the same random q, k and v.

    The step's batch is the runner's own (its metadata, its kernel); the new keys and values
    are written into the pool as in a forward, so every backend reads the same keys.
    """
    batch = runner._build_batch(runner.buffers.build(chunks))[0]
    config = runner.model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    tokens = sum(len(c.token_ids) for c in chunks)
    generator = torch.Generator().manual_seed(seed)
    pool = runner.pool
    outputs = []
    with torch.inference_mode():  # as in a forward: gather buffers are inference tensors
        for layer in range(config.num_hidden_layers):
            q, k, v = (
                torch.randn(1, h, tokens, dim, generator=generator).to(pool.device, pool.dtype)
                for h in (heads, kv_heads, kv_heads)
            )
            out, _ = paged_attention(
                SimpleNamespace(layer_idx=layer), q, k, v, None, dim**-0.5, **{BATCH_KWARG: batch}
            )
            outputs.append(out[0])
    return outputs


def mixed_step(page: int, generator: torch.Generator) -> tuple[list, list]:
    """Context-filling chunks, then one step of every kind of row.

    Three sequences share 3 prefix pages (their decodes form a cascade group on the SDPA
    path), one decodes alone, one continues a chunked prefill, one starts a prompt.
    """

    def tokens(n: int) -> list[int]:
        return torch.randint(3, 300, (n,), generator=generator).tolist()

    shared = [0, 1, 2]
    tables = {
        "a": [*shared, 10, 11],
        "b": [*shared, 20, 21],
        "c": [*shared, 30, 31],
        "solo": [40, 41, 42, 43],
        "chunked": [50, 51, 52, 53, 54, 55],
        "fresh": [60, 61, 62],
    }
    prefix = tokens(3 * page)
    setup = [ScheduledChunk(prefix, 0, shared, False)]
    lengths = {"a": 3 * page + 2, "b": 3 * page + 5, "c": 4 * page + 1, "solo": 2 * page + 3}
    for name in ("a", "b", "c"):
        setup.append(
            ScheduledChunk(tokens(lengths[name] - 3 * page), 3 * page, tables[name], False)
        )
    setup.append(ScheduledChunk(tokens(lengths["solo"]), 0, tables["solo"], False))
    setup.append(ScheduledChunk(tokens(2 * page + 1), 0, tables["chunked"], False))
    step = [
        *(ScheduledChunk(tokens(1), lengths[n], tables[n], True) for n in ("a", "b", "c")),
        ScheduledChunk(tokens(1), lengths["solo"], tables["solo"], True),
        ScheduledChunk(tokens(3 * page - 2), 2 * page + 1, tables["chunked"], True),
        ScheduledChunk(tokens(2 * page + 3), 0, tables["fresh"], True),
    ]
    return setup, step


@pytest.mark.parametrize("reference", [CsrReference, BlockTableReference])
def test_reference_kernel_equals_sdpa_attention(tiny_llama_dir, reference):
    model, pool = model_and_pool(tiny_llama_dir)
    setup, step = mixed_step(PAGE, torch.Generator().manual_seed(0))
    sdpa = ModelRunner(model, pool, numerics="fast")
    for chunk in setup:
        sdpa.forward([chunk])
    expected = step_attention(sdpa, step)
    kernel = reference()
    got = step_attention(ModelRunner(model, pool, numerics="fast", attention_kernel=kernel), step)
    assert kernel.calls == model.config.num_hidden_layers  # one call per layer, whole step
    assert len(got) == len(expected) == model.config.num_hidden_layers
    for layer, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have.shape == want.shape == (sum(len(c.token_ids) for c in step), 4, 16)
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=f"layer {layer}")


def test_a_kernel_needs_fast_numerics(tiny_llama_dir):
    model, pool = model_and_pool(tiny_llama_dir)
    with pytest.raises(ValueError, match=r"^an attention kernel does not keep invariant numerics"):
        ModelRunner(model, pool, attention_kernel=CsrReference())


def test_engine_through_reference_kernel_is_greedy_exact(tiny_llama_dir):
    """Chunked prefills (token budget 20), prefix hits, preemptions (24 pages of 8 tokens):
    every step's attention goes through the metadata only."""
    loaded = load_model(tiny_llama_dir)
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=3, shared=True, count=12)
    config = EngineConfig(
        page_size=8,
        num_pages=24,
        max_num_seqs=8,
        max_num_batched_tokens=20,
        numerics="fast",
        attention_backend="sdpa",
    )
    core = EngineCore(loaded, config)
    kernel = CsrReference()
    core.runner.attention_kernel = kernel  # the reference in the kernel's place
    outputs = greedy(core, prompts, 16)
    stats = core.stats()
    assert stats.preemptions > 0 and stats.cache.hit_tokens > 0
    assert kernel.calls == stats.steps * loaded.model.config.num_hidden_layers
    expected = hf_greedy(tiny_llama_dir, prompts, 16)
    assert outputs == expected


def greedy(core: EngineCore, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The engine's greedy tokens per prompt, its invariants checked after every step."""
    params = SamplingParams(max_tokens=max_tokens)
    for index, prompt in enumerate(prompts):
        assert core.add_request(GenerationRequest(index, prompt, params)) == []
    outputs: dict[int, list[int]] = {}
    while core.num_unfinished:
        for result in core.step():
            outputs[result.request_id] = list(result.token_ids)
        core.check_invariants()
    return [outputs[i] for i in range(len(prompts))]


# -- the real kernels (CUDA) -------------------------------------------------------------------

CUDA = torch.cuda.is_available()


def _kernel_case(backend: str, module: str):
    marks = [
        pytest.mark.skipif(not CUDA, reason="needs a CUDA device"),
        pytest.mark.skipif(
            importlib.util.find_spec(module) is None, reason=f"{module} is not installed"
        ),
    ]
    return pytest.param(backend, marks=marks, id=backend)


KERNELS = [_kernel_case("flashinfer", "flashinfer"), _kernel_case("flash-attn", "flash_attn")]


def _page_for(backend: str) -> int:
    return 256 if backend == "flash-attn" else PAGE  # FA2 reads pages of 256 keys or more


@pytest.fixture(scope="module")
def wide_llama_dir(tmp_path_factory):
    """The tiny model with a head dimension of 64, the smallest FlashInfer compiles."""
    from conftest import build_tiny_tokenizer, tiny_config_kwargs
    from transformers import LlamaConfig

    tokenizer = build_tiny_tokenizer()
    kwargs = {**tiny_config_kwargs(tokenizer), "hidden_size": 256, "intermediate_size": 512}
    torch.manual_seed(99)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**kwargs), dtype=torch.float32)
    path = tmp_path_factory.mktemp("wide-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("backend", KERNELS)
def test_cuda_kernel_close_to_sdpa(wide_llama_dir, backend):
    page = _page_for(backend)
    model, pool = model_and_pool(
        wide_llama_dir, dtype=torch.bfloat16, device="cuda", page=page, pages=128
    )
    setup, step = mixed_step(page, torch.Generator().manual_seed(0))
    sdpa = ModelRunner(model, pool, numerics="fast")
    for chunk in setup:
        sdpa.forward([chunk])
    expected = step_attention(sdpa, step)
    kernel = make_kernel(backend, torch.device("cuda"))
    got = step_attention(ModelRunner(model, pool, numerics="fast", attention_kernel=kernel), step)
    for layer, (want, have) in enumerate(zip(expected, got, strict=True)):
        torch.testing.assert_close(
            have.float(), want.float(), rtol=2e-2, atol=2e-2, msg=f"layer {layer}"
        )


@pytest.mark.parametrize("backend", KERNELS)
def test_cuda_kernel_greedy_equals_transformers(wide_llama_dir, backend):
    """bfloat16 on both sides; the tiny model's wide init keeps greedy margins far above
    bfloat16 rounding, so the tokens must agree exactly."""
    page = _page_for(backend)
    loaded = load_model(wide_llama_dir, device="cuda", dtype="bfloat16")
    prompts = mixed_prompts(loaded.model.config.vocab_size, seed=5, shared=True, count=8)
    config = EngineConfig(
        page_size=page,
        num_pages=max(64, 4096 // page),
        numerics="fast",
        attention_backend=backend,
    )
    core = EngineCore(loaded, config)
    assert core.attention_backend == backend
    outputs = greedy(core, prompts, 12)
    model = loaded.model
    model.set_attn_implementation("sdpa")
    expected = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device="cuda")
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=12,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
            expected.append(out[0, len(prompt) :].tolist())
    assert outputs == expected
