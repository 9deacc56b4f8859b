"""The CPU's invariant bfloat16 attention (`invariant_cpu`): the C kernel, built here.

A token's bits cannot depend on the other tokens of a call (one token x KV head per work
item, each walking its own keys); what can break is the indexing (pages, key counts, group
heads, windows, image ends, sinks) and the arithmetic's promise: transformers' bfloat16
attention (torch's CPU flash kernel, one call per sequence) to within its last bit, and the
same bits from the vectorized and the portable code. Checked against a float64 brute force,
torch's own kernels, and a token alone against random crowds.
"""

from __future__ import annotations

import platform
import random
import shutil
import subprocess

import pytest
import torch
from attention_kit import paged_brute_force as brute_force
from attention_kit import random_kv_pool as random_pool

from astrai_batch.engine.attention.kernels import invariant_cpu
from astrai_batch.engine.attention.kernels.invariant_cpu import (
    FLAGS,
    KernelUnavailable,
    build,
    load_kernel,
)
from astrai_batch.engine.model.converted import cache_root
from astrai_batch.engine.runner.invariant_cpu import cpu_attention

SPLIT = 512  # the C source's walk: torch's flash kernel's own key split
CASES = [  # (kv heads, group, head dim, value dim, page size)
    (2, 1, 16, 16, 8),
    (3, 3, 64, 64, 16),
    (1, 4, 32, 24, 4),
    (2, 5, 20, 20, 64),
    (1, 2, 256, 256, 16),
    (2, 2, 128, 128, 16),  # the C source's fixed-shape paths: head sizes 64 and 128,
    (1, 7, 64, 64, 8),  # rows in register blocks of 4 (64) and 2 (128), and a remainder
    (2, 3, 56, 60, 16),  # the fixed-shape paths with part of a chunk masked
]


@pytest.fixture(scope="module")
def kernel():
    return load_kernel(cache_root())


def bf16_pool(seed, kv_heads, head_dim, value_dim, page_size, longest=1300):
    """A random bfloat16 pool whose pages hold a table of `longest` keys."""
    pages = longest // page_size + 8
    g, keys, values = random_pool(seed, kv_heads, head_dim, value_dim, page_size, pages)
    return g, keys.bfloat16(), values.bfloat16()


def tables_for(g, pages, rows, width):
    return torch.stack([torch.randperm(pages, generator=g)[:width] for _ in range(rows)]).int()


def within_bf16(got, q, keys, values, *args, **extra):
    """Each element within bfloat16's own error of the float64 attention: one rounding of the
    output (a step at its magnitude) and one of each probability (a half step of each
    weighted value, whose sum may cancel: bounded by the weighted magnitudes')."""
    pool = (q.float(), keys.float())
    expected = brute_force(*pool, values.float(), *args, **extra)
    magnitude = brute_force(*pool, values.float().abs(), *args, **extra)
    eps = torch.finfo(torch.bfloat16).eps
    bound = eps * expected.abs() + eps / 2 * magnitude + 1e-6
    assert (got.double() - expected).abs().le(bound).all()


@pytest.mark.parametrize(("kv_heads", "group", "head_dim", "value_dim", "page_size"), CASES)
def test_matches_a_float64_brute_force(kernel, kv_heads, group, head_dim, value_dim, page_size):
    g, keys, values = bf16_pool(1, kv_heads, head_dim, value_dim, page_size)
    width = (2 * SPLIT + 100) // page_size + 1
    tables = tables_for(g, keys.shape[0] // page_size, 3, width)
    token_keys = torch.tensor([1, 2, 15, 16, 17, SPLIT - 1, SPLIT, SPLIT + 1, 2 * SPLIT + 100])
    token_table = torch.arange(len(token_keys)) % 3
    q = torch.randn(len(token_keys), kv_heads * group, head_dim, generator=g).bfloat16()
    args = (tables, token_table.int(), token_keys.int(), page_size, head_dim**-0.5)
    got = kernel.attend(q, keys, values, *args)
    assert got.shape == (len(token_keys), kv_heads * group, value_dim)
    assert got.dtype == torch.bfloat16
    within_bf16(got, q, keys, values, *args)


@pytest.mark.parametrize(
    ("window", "with_sinks"), [(40, False), (SPLIT, True), (600, True), (None, True)]
)
def test_windows_and_sinks_match_a_float64_brute_force(kernel, window, with_sinks):
    kv_heads, group, head_dim, page_size = 2, 3, 16, 8
    g, keys, values = bf16_pool(2, kv_heads, head_dim, head_dim, page_size)
    tables = tables_for(g, keys.shape[0] // page_size, 3, 140)
    token_keys = torch.tensor([1, 39, 40, 41, SPLIT + 1, 600, 601, 1100])
    token_table = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    q = torch.randn(len(token_keys), kv_heads * group, head_dim, generator=g).bfloat16()
    sinks = torch.tensor([0.5, -1.0, 2.0, 8.0, -30.0, 1.5]) if with_sinks else None
    args = (tables, token_table.int(), token_keys.int(), page_size, head_dim**-0.5)
    got = kernel.attend(q, keys, values, *args, window=window, sinks=sinks)
    within_bf16(got, q, keys, values, *args, window=window, sinks=sinks)


def test_an_images_tokens_see_the_whole_image(kernel):
    """`key_ends`: a token inside an image attends up to the image's end; its window (none
    here) and everything else stay its own position's."""
    kv_heads, group, head_dim, page_size = 1, 2, 16, 8
    g, keys, values = bf16_pool(3, kv_heads, head_dim, head_dim, page_size)
    tables = tables_for(g, keys.shape[0] // page_size, 1, 20)
    q = torch.randn(3, kv_heads * group, head_dim, generator=g).bfloat16()
    token_keys = torch.tensor([10, 11, 12]).int()
    ends = torch.tensor([14, 14, 14]).int()
    args = (tables, torch.zeros(3).int(), page_size, 0.25)
    got = kernel.attend(q, keys, values, args[0], args[1], token_keys, *args[2:], key_ends=ends)
    within_bf16(got, q, keys, values, args[0], args[1], token_keys, *args[2:], key_ends=ends)


@pytest.mark.parametrize(("kv_heads", "group", "head_dim", "value_dim", "page_size"), CASES)
@pytest.mark.parametrize("window", [None, 40])
def test_a_step_bound_once_gives_attends_bits(
    kernel, kv_heads, group, head_dim, value_dim, page_size, window
):
    """`CpuKernel.step` (the direct layer path: index arrays bound once a step, each layer
    giving its queries, pools and output) computes `attend`'s bits, with and without windows
    and image ends, and refuses what it would misread."""
    g, keys, values = bf16_pool(4, kv_heads, head_dim, value_dim, page_size)
    tables = tables_for(g, keys.shape[0] // page_size, 3, (SPLIT + 100) // page_size + 1)
    token_keys = torch.tensor([1, 17, 40, SPLIT, SPLIT + 60, 9, 10]).int()
    token_table = torch.tensor([0, 1, 2, 0, 1, 2, 2]).int()
    ends = torch.tensor([1, 17, 40, SPLIT, SPLIT + 60, 12, 12]).int()
    q = torch.randn(len(token_keys), kv_heads * group, head_dim, generator=g).bfloat16()
    scale = head_dim**-0.5
    for key_ends in (None, ends):
        step = kernel.step(tables, token_table, token_keys, page_size, key_ends)
        extra = {} if key_ends is None else {"key_ends": key_ends}
        args = (tables, token_table, token_keys, page_size, scale)
        expected = kernel.attend(q, keys, values, *args, window=window, **extra)
        out = torch.empty_like(expected)
        step.attend(q, keys, values, out, scale, window, 2)
        assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="other tokens or outputs"):
        step.attend(q[:2], keys, values, out[:2], scale, window, 2)
    with pytest.raises(ValueError, match="needs CPU bfloat16 rows"):
        step.attend(q.float(), keys, values, out, scale, window, 2)
    with pytest.raises(ValueError, match="contiguous queries and output"):
        step.attend(
            q.transpose(0, 1).contiguous().transpose(0, 1), keys, values, out, scale, None, 2
        )


def torch_attention(q, keys, values, tables, token_table, token_keys, page_size, scale, backend):
    """Each token as transformers' bfloat16 SDPA computes it: one call over its keys."""
    kv_heads, rows = keys.shape[1], []
    group = q.shape[1] // kv_heads
    for t in range(q.shape[0]):
        n = int(token_keys[t])
        row = tables[int(token_table[t])].long()
        slots = (row[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n]
        k = keys[slots].transpose(0, 1).repeat_interleave(group, 0)[None]
        v = values[slots].transpose(0, 1).repeat_interleave(group, 0)[None]
        with torch.nn.attention.sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q[t][None, :, None], k, v, scale=scale
            )
        rows.append(out[0, :, 0])
    return torch.stack(rows)


def test_agrees_with_torchs_flash_kernel_closer_than_torchs_own_backends(kernel):
    """transformers' bfloat16 attention on the CPU is torch's flash kernel: ours rounds as it
    does (probabilities to bfloat16 per 512-key split, the output once), so it gives the
    flash kernel's bits more often than torch's own math backend does (measured: 94% of
    elements against 69%), and its largest gap is no larger than the math backend's."""
    kv_heads, group, head_dim, page_size = 3, 3, 64, 16
    g, keys, values = bf16_pool(4, kv_heads, head_dim, head_dim, page_size, longest=1400)
    tables = tables_for(g, keys.shape[0] // page_size, 24, -(-1400 // page_size))
    token_keys = torch.randint(1, 1400, (24,), generator=g).int()
    token_table = torch.arange(24).int()
    q = (torch.randn(24, kv_heads * group, head_dim, generator=g) * 2).bfloat16()
    args = (q, keys, values, tables, token_table, token_keys, page_size, head_dim**-0.5)
    ours = kernel.attend(*args)
    backends = torch.nn.attention.SDPBackend
    flash = torch_attention(*args, backends.FLASH_ATTENTION)
    math = torch_attention(*args, backends.MATH)
    agree = (ours == flash).float().mean().item()
    assert agree > (math == flash).float().mean().item()
    assert agree > 0.85
    gap = (ours.float() - flash.float()).abs()
    assert gap.max() <= (math.float() - flash.float()).abs().max()


@pytest.mark.parametrize("seed", range(3))
def test_a_token_alone_equals_the_token_in_random_crowds(kernel, seed):
    kv_heads, group, head_dim, page_size = 2, 3, 32, 8
    g, keys, values = bf16_pool(seed, kv_heads, head_dim, head_dim, page_size)
    tables = tables_for(g, keys.shape[0] // page_size, 6, 150)
    q = torch.randn(1, kv_heads * group, head_dim, generator=g).bfloat16()
    table, seen = 2, 700
    one = (torch.tensor([table]).int(), torch.tensor([seen]).int(), page_size, 0.2)
    alone = kernel.attend(q, keys, values, tables, *one, window=300)
    torch.set_num_threads(2)
    for size in (2, 5, 17, 200):
        crowd_q = torch.randn(size, kv_heads * group, head_dim, generator=g).bfloat16()
        at = int(torch.randint(size, (1,), generator=g))
        crowd_q[at] = q[0]
        token_table = torch.randint(6, (size,), generator=g).int()
        token_keys = torch.randint(1, 1200, (size,), generator=g).int()
        token_table[at], token_keys[at] = table, seen
        crowd = kernel.attend(
            crowd_q, keys, values, tables, token_table, token_keys, page_size, 0.2, window=300
        )
        assert torch.equal(crowd[at], alone[0]), f"seed {seed}, crowd of {size}"


def test_the_portable_code_gives_the_vectorized_codes_bits(kernel):
    """Built for a CPU without AVX-512 (the portable C) and for this one: the same bits, so
    a job's rows do not depend on which of the two a machine runs."""
    with open("/proc/cpuinfo") as info:
        flags = info.read()
    if "avx512f" not in flags:
        pytest.skip("this CPU runs the portable code already")
    portable = load_kernel(
        cache_root(), tuple("-march=x86-64-v3" if f == "-march=native" else f for f in FLAGS)
    )
    rng = random.Random(5)
    for kv_heads, group, head_dim, value_dim, page_size in CASES:
        g, keys, values = bf16_pool(rng.randrange(100), kv_heads, head_dim, value_dim, page_size)
        tables = tables_for(g, keys.shape[0] // page_size, 4, -(-1300 // page_size))
        token_keys = torch.randint(1, 1300, (40,), generator=g).int()
        token_table = torch.randint(4, (40,), generator=g).int()
        q = torch.randn(40, kv_heads * group, head_dim, generator=g).bfloat16()
        sinks = torch.randn(kv_heads * group, generator=g)
        args = (q, keys, values, tables, token_table, token_keys, page_size, 0.3)
        for extra in ({}, {"window": 200, "sinks": sinks}):
            assert torch.equal(kernel.attend(*args, **extra), portable.attend(*args, **extra))


@pytest.mark.parametrize(("march", "least"), [("-march=native", 8), ("-march=x86-64-v3", 2)])
def test_the_built_kernel_keeps_its_prefetches(march, least):
    """GCC deletes `__builtin_prefetch` loops as code without effects (the kernel's prefetches
    were missing from its binary from a791e7f to 9238951): the walk's (unrolled, AVX-512)
    and the split's (the portable build's key and value loops) must be in the machine code."""
    objdump = shutil.which("objdump")
    if objdump is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs objdump and an x86-64 build")
    with open("/proc/cpuinfo") as info:
        if march == "-march=native" and "avx512f" not in info.read():
            pytest.skip("this CPU builds the portable code")
    library = build(cache_root(), tuple(march if f == "-march=native" else f for f in FLAGS))
    code = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True).stdout
    sites = sum("prefetcht" in line for line in code.splitlines())
    assert sites >= least, f"{sites} prefetch instructions in the {march} build"


def test_refuses_what_it_cannot_compute(kernel):
    _, keys, values = bf16_pool(0, 1, 16, 16, 8)
    one = torch.ones(1).int()
    q = torch.zeros(1, 2, 16).bfloat16()
    with pytest.raises(ValueError, match="cannot apply softcapping"):
        kernel.attend(q, keys, values, one[None], one - 1, one, 8, 0.25, softcap=30.0)
    with pytest.raises(ValueError, match="needs CPU bfloat16 queries"):
        kernel.attend(q.float(), keys, values, one[None], one - 1, one, 8, 0.25)
    big = torch.zeros(8, 1, 272).bfloat16()
    with pytest.raises(ValueError, match="head sizes up to 256"):
        kernel.attend(torch.zeros(1, 1, 272).bfloat16(), big, big, one[None], one - 1, one, 8, 1.0)
    with pytest.raises(IndexError, match="page table row or pages lie outside the pool"):
        kernel.attend(q, keys, values, one[None], one - 1, one * 9, 8, 0.25)  # 2 pages: 1 given
    with pytest.raises(IndexError, match="outside the pool"):
        kernel.attend(q, keys, values, one[None] * 10**6, one - 1, one, 8, 0.25)
    empty = torch.zeros(0, dtype=torch.int32)
    assert kernel.attend(q[:0], keys, values, one[None], empty, empty, 8, 0.25).shape == (0, 2, 16)


def test_no_compiler_leaves_torchs_kernel_with_a_warning(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ASTRAI_BATCH_CACHE", str(tmp_path))
    with pytest.raises(KernelUnavailable, match="no C compiler"):
        invariant_cpu.build(tmp_path)
    pool = type("Pool", (), {})()
    pool.key_cache = pool.value_cache = [torch.zeros(16, 1, 16, dtype=torch.bfloat16)]
    pool.page_size = 8
    with caplog.at_level("WARNING"):
        assert cpu_attention(2, pool) is None
    assert "the CPU attention kernel does not run here (no C compiler" in caplog.text


def test_a_compile_error_is_reported_in_one_line(monkeypatch, tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: error: unrecognized option' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(KernelUnavailable, match=r"building invariant_cpu\.c failed: cc: error"):
        invariant_cpu.build(tmp_path)
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_switched_off_or_not_bfloat16_keeps_torchs_kernel(monkeypatch):
    pool = type("Pool", (), {})()
    pool.page_size = 8
    pool.key_cache = pool.value_cache = [torch.zeros(16, 1, 16)]
    assert cpu_attention(2, pool) is None  # float32: torch's flash kernel in probed blocks
    pool.key_cache = pool.value_cache = [torch.zeros(16, 1, 16, dtype=torch.bfloat16)]
    assert cpu_attention(2, pool) is not None
    monkeypatch.setenv("ASTRAI_BATCH_CPU_KERNEL", "0")
    assert cpu_attention(2, pool) is None


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("extra", ["plain", "window", "sinks", "image"])
def test_a_prefill_chunk_equals_its_tokens_alone(kernel, extra, head_dim):
    """A chunk's consecutive tokens are computed four at a time (their keys and values read
    once for all of them): each token's bits equal the token computed alone, for chunks
    starting anywhere, across 512-key splits, with windows, sinks and image ends; at head
    sizes of the generic code (32) and of the fixed-shape paths (64, 128), whose register
    blocks then hold rows of tokens that see different keys."""
    kv_heads, group, page_size = 2, 3, 8
    g, keys, values = bf16_pool(7, kv_heads, head_dim, head_dim, page_size)
    tables = tables_for(g, keys.shape[0] // page_size, 3, -(-1300 // page_size))
    rng = random.Random(7)
    token_table, token_keys = [], []
    for row, (start, length) in enumerate(((0, 37), (490, 30), (1100, 9))):
        token_table += [row] * length
        token_keys += list(range(start + 1, start + length + 1))
    count = len(token_keys)
    q = torch.randn(count, kv_heads * group, head_dim, generator=g).bfloat16()
    options = {
        "plain": {},
        "window": {"window": 20},
        "sinks": {"sinks": torch.randn(kv_heads * group, generator=g)},
        "image": {"key_ends": torch.tensor([k + rng.randint(0, 3) for k in token_keys]).int()},
    }[extra]
    tables_, pages = tables, page_size
    chunk = kernel.attend(
        q, keys, values, tables_, torch.tensor(token_table).int(), torch.tensor(token_keys).int(),
        pages, 0.3, **options,
    )  # fmt: skip
    for t in range(count):
        one = {k: v[t : t + 1] if k == "key_ends" else v for k, v in options.items()}
        alone = kernel.attend(
            q[t : t + 1], keys, values, tables_, torch.tensor([token_table[t]]).int(),
            torch.tensor([token_keys[t]]).int(), pages, 0.3, **one,
        )  # fmt: skip
        assert torch.equal(chunk[t], alone[0]), f"{extra}: token {t}"
