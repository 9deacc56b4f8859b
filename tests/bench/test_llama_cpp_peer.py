"""The llama-cpp peer's logic that needs no llama.cpp: the shared-prefix prefill plan, the
context's size, the checks before any model loads (the missing extra in one line), and the
greedy agreement beside ours. The run against the real llama.cpp is in
test_llama_cpp_peer_long.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from astrai_batch.bench import llama_cpp_peer
from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.llama_cpp_peer import (
    CONTEXT_ROUNDING,
    EXTRA_HINT,
    WavePlan,
    check_llama_cpp_peer,
    gguf_path,
    wave_plan,
)
from astrai_batch.bench.llama_cpp_plan import PlannedToken, prefill_plan, prefix_tree_tokens
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.runs import SystemRun
from astrai_batch.bench.session import _agreement_columns
from astrai_batch.cli import main
from astrai_batch.engine.model.gguf import SMOLLM2_135M, locate_packaged_gguf
from astrai_batch.errors import ConfigError

MISSING = f"peers: llama-cpp needs llama-cpp-python, the extra 'llama-cpp': {EXTRA_HINT}"


def test_shared_cells_are_planned_once_with_every_sharing_sequence() -> None:
    prompts = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3], [1, 2]]
    (plan,) = prefill_plan(prompts, chunk_tokens=100)
    # sorted: [1, 2] (4), [1, 2, 3] (0, 3), [1, 2, 4] (1), [1, 5] (2)
    assert plan == [
        PlannedToken(1, 0, (0, 1, 2, 3, 4), ()),
        PlannedToken(2, 1, (0, 1, 3, 4), (4,)),
        PlannedToken(3, 2, (0, 3), (0, 3)),
        PlannedToken(4, 2, (1,), (1,)),
        PlannedToken(5, 1, (2,), (2,)),
    ]
    assert prefix_tree_tokens(prompts) == 5
    assert [len(chunk) for chunk in prefill_plan(prompts, chunk_tokens=2)] == [2, 2, 1]


def test_the_plan_refuses_what_llama_cpp_cannot_decode() -> None:
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1, got 0"):
        prefill_plan([[1]], chunk_tokens=0)
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        prefill_plan([[1], []], chunk_tokens=4)


@settings(max_examples=200, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=7), min_size=1, max_size=12),
    chunk=st.integers(1, 9),
)
def test_every_sequence_sees_its_whole_prompt_in_order_and_each_cell_is_computed_once(
    prompts: list[list[int]], chunk: int
) -> None:
    chunks = prefill_plan(prompts, chunk)
    planned = [token for piece in chunks for token in piece]
    assert all(len(piece) <= chunk for piece in chunks)
    assert len(planned) == prefix_tree_tokens(prompts)
    # the distinct (prefix, token) nodes of the tree, counted by brute force
    assert len(planned) == len({tuple(p[: i + 1]) for p in prompts for i in range(len(p))})
    for index, prompt in enumerate(prompts):
        seen = [t for t in planned if index in t.seq_ids]
        assert [t.token for t in seen] == prompt
        assert [t.position for t in seen] == list(range(len(prompt)))  # llama.cpp's batch rule
        assert [t.position for t in planned if index in t.ends] == [len(prompt) - 1]


def test_the_context_holds_the_largest_waves_tree_and_its_generated_tokens() -> None:
    prompts = [[1, 2, 3], [1, 2, 4], [7, 8, 9, 10]]
    # one wave: tree 1,2,3,4 + 7,8,9,10 = 8 cells, + 3 x 100 generated = 308 -> 512
    assert wave_plan(prompts, 100, wave=64) == WavePlan(3, 2 * CONTEXT_ROUNDING)
    # waves of 2: [1,2,3],[1,2,4] (4 + 200) and [7,8,9,10] (4 + 100) -> 204 -> 256
    assert wave_plan(prompts, 100, wave=2) == WavePlan(2, CONTEXT_ROUNDING)
    with pytest.raises(ValueError, match="wave must be at least 1, got 0"):
        wave_plan(prompts, 1, wave=0)


@pytest.fixture
def without_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "llama_cpp" else real(name, *args)

    monkeypatch.setattr(llama_cpp_peer.importlib.util, "find_spec", find_spec)


@pytest.fixture
def with_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return object() if name == "llama_cpp" else real(name, *args)

    monkeypatch.setattr(llama_cpp_peer.importlib.util, "find_spec", find_spec)


@pytest.mark.usefixtures("without_llama_cpp")
def test_a_missing_extra_is_one_line_naming_it_before_any_model_loads() -> None:
    with pytest.raises(ConfigError) as caught:
        BenchConfig(model="smollm2-135m", device="cpu", peers=("llama-cpp",))
    assert str(caught.value) == MISSING
    result = CliRunner().invoke(
        main, ["bench", "--device", "cpu", "--peers", "llama-cpp"], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == f"Error: {MISSING}"
    BenchConfig(model="smollm2-135m", device="cpu")  # the default peers do not need it


@pytest.mark.usefixtures("with_llama_cpp")
def test_the_peer_runs_gguf_files_on_the_cpu(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        BenchConfig(model=str(tiny_llama_dir), device="cpu", peers=("llama-cpp",))
    assert str(caught.value) == (
        f"peers: llama-cpp runs a GGUF file; --model {tiny_llama_dir} is not one (give a .gguf "
        "path or a packaged alias such as smollm2-135m)"
    )
    with pytest.raises(
        ConfigError, match=r"^peers: llama-cpp runs on the CPU; got --device cuda:0$"
    ):
        check_llama_cpp_peer("smollm2-135m", "cuda:0")
    assert gguf_path("SmolLM2-135M-Instruct") == locate_packaged_gguf(SMOLLM2_135M)
    own = tmp_path / "model.GGUF"
    own.write_bytes(b"GGUF")
    assert gguf_path(str(own)) == own.resolve()
    with pytest.raises(ConfigError, match="generates; --workload scoring compares with"):
        BenchConfig(model="smollm2-135m", device="cpu", workload="scoring", peers=("llama-cpp",))


def _run(system: str, tokens: list[list[int]] | None) -> SystemRun:
    return SystemRun(
        system=system,
        repeat=0,
        wall_seconds=1.0,
        prompt_tokens=6,
        generated_tokens=8,
        peak_rss_bytes=None,
        system_config="{}",
        token_ids=None if tokens is None else tuple(map(tuple, tokens)),
    )


def test_agreement_counts_equal_tokens_and_tokens_before_the_first_difference() -> None:
    prompts = BenchPrompts(
        workload="w",
        prompt_token_ids=((1, 2, 3), (4, 5, 6)),
        max_tokens=4,
        ideal=None,  # type: ignore[arg-type]  # not read by the agreement
    )
    ours = _run("astrai", [[7, 8, 9, 10], [11, 12, 13, 14]])
    theirs = _run("llama-cpp", [[7, 8, 0, 10], [11, 12, 13, 14]])
    # 7 of 8 tokens equal; 2 + 4 before each prompt's first difference
    assert _agreement_columns(prompts, ours, theirs) == {
        "greedy_agreement": 7 / 8,
        "greedy_leading_agreement": 6 / 8,
    }
    assert _agreement_columns(prompts, ours, _run("hf-generate", None)) == {}
    assert _agreement_columns(prompts, None, theirs) == {}
