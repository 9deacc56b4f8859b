"""The batch-invariance promise checked where the engine runs, when it loads.

Invariant numerics are invariant by construction on the CPU the tests run on; on another
device (CUDA), another BLAS or another kernel the construction rests on properties that
nobody here has observed. So before a job's first request, the engine runs a few probe rows
alone and inside a crowd, at two step shapes (a token budget that puts the whole crowd's
prefill into one step, and one that chunks it), through the
real forward of the engine being built (same model, pool layout, numerics, decode path);
every sampled position's logits must be bitwise equal. If not, the engine refuses in one
line naming `--fast-numerics`.

`crowd_check` is the same comparison at any size: the device check (`bench/gpu_check`)
runs it at several budgets, with the prefix cache on and off.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.types import GenerationRequest
from astrai_batch.errors import NumericsUnavailableError

Rows = dict[Hashable, tuple[tuple[int, ...], list[torch.Tensor]]]
# an engine core for a configuration, which does not probe itself (given by the caller: the
# core runs this module, so this module does not import the core)
MakeCore = Callable[[EngineConfig], Any]

# Probe rows: lengths that cover one page, a partial 64-key block and two blocks; fillers
# that share a prefix with a probe row (the cascade / shared-block path) and change the
# step's row count from each probe row's own. Three tokens each: a prefill's logits and
# decodes. Kept small: the probe runs at every engine start (SmolLM2, one CPU thread: 2.5 s).
PROBE_LENGTHS = (7, 40, 70)
FILLER_LENGTHS = (6, 33, 12)
PROBE_TOKENS = 3
PROBE_BUDGETS = (512, 48)  # the whole crowd's prefill in one step, then chunked prefills
PROBE_SEED = 20
PROBE_CONTEXT = 80  # the longest probe row (a 64-token shared prefix + 6) and its tokens


def check_invariance_at_start(
    loaded: LoadedModel, config: EngineConfig, make_core: MakeCore, *, decode_path: str = "eager"
) -> None:
    """Raise `NumericsUnavailableError` unless the probe rows' logits are the same alone and
    in a crowd."""
    vocab = loaded.model.config.vocab_size
    room = min(loaded.max_model_len, config.max_model_len or loaded.max_model_len)
    context = min(room, PROBE_CONTEXT)
    prompts = probe_prompts(vocab, PROBE_SEED, max(1, context - PROBE_TOKENS))
    watched = range(len(PROBE_LENGTHS))
    # a short context: a contiguous layout's seats (one context each) stay small too
    pages = len(prompts) * -(-context // config.page_size) + 2
    base = dataclasses.replace(
        config,
        num_pages=pages,
        kv_cache_memory=None,
        max_model_len=context,
        max_num_seqs=len(prompts),
        cuda_graphs=False,  # capture belongs to the job; the graphs' bits: gpu_check
        lookahead=None,
    )
    # adapters installed after a probe change the model: they are part of what was probed
    from astrai_batch.engine.lora.bank import find_bank

    key = (base, decode_path, id(find_bank(loaded.model)))
    if key in loaded.invariance_passed:
        return
    problem = crowd_check(
        make_core,
        prompts,
        watched,
        [dataclasses.replace(base, max_num_batched_tokens=b) for b in PROBE_BUDGETS],
        alone=dataclasses.replace(base, max_num_seqs=1, max_num_batched_tokens=PROBE_BUDGETS[0]),
        max_tokens=PROBE_TOKENS,
    )
    if problem is not None:
        param = next(loaded.model.parameters())
        raise NumericsUnavailableError(
            f"invariant numerics do not hold here ({param.device.type}, "
            f"{str(param.dtype).removeprefix('torch.')}): {problem} in the start-up check; "
            "run with --fast-numerics to accept results that depend on the batch"
        )
    loaded.invariance_passed.add(key)


def probe_prompts(vocab_size: int, seed: int, cap: int) -> list[list[int]]:
    """The probe rows, then the fillers; the first filler shares the last probe row's
    first 64 tokens."""
    rng = random.Random(seed)
    rows = [[rng.randrange(3, vocab_size) for _ in range(min(n, cap))] for n in PROBE_LENGTHS]
    fillers = [[rng.randrange(3, vocab_size) for _ in range(min(n, cap))] for n in FILLER_LENGTHS]
    fillers[0] = (rows[-1][:64] + fillers[0])[:cap]
    return rows + fillers


def crowd_check(
    make_core: MakeCore,
    prompts: Sequence[Sequence[int]],
    watched: Sequence[int],
    crowds: Sequence[EngineConfig],
    *,
    alone: EngineConfig,
    max_tokens: int,
) -> str | None:
    """Runs each watched prompt alone (one at a time under `alone`), then all prompts under
    each crowd configuration; the first difference in words, or None when every watched
    row's tokens and logits are bitwise the same."""
    reference = run_rows(make_core(alone), prompts, watched, max_tokens)
    everyone = range(len(prompts))
    # every run first, then the comparisons: the check costs the same whether it passes
    runs = [run_rows(make_core(c), prompts, everyone, max_tokens) for c in crowds]
    for config, crowd in zip(crowds, runs, strict=True):
        problem = first_difference(reference, crowd, watched)
        if problem is not None:
            return f"{problem} (token budget {config.max_num_batched_tokens})"
    return None


def run_rows(
    core: Any, prompts: Sequence[Sequence[int]], ids: Sequence[int], max_tokens: int
) -> Rows:
    """{id: (greedy tokens, logits of each generated position)} of `prompts[ids]` on a fresh
    engine core, closed afterwards."""
    try:
        return capture(core, prompts, ids, max_tokens)
    finally:
        core.close()


def capture(
    core: Any, prompts: Sequence[Sequence[int]], ids: Sequence[int], max_tokens: int
) -> Rows:
    logits: dict[Hashable, list[torch.Tensor]] = {}
    core.logits_observer = lambda rid, _i, row: logits.setdefault(rid, []).append(row.clone())
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i in ids:
        errors = core.add_request(GenerationRequest(i, list(prompts[i]), params))
        if errors:
            raise RuntimeError(errors[0].error)
    tokens: dict[Hashable, tuple[int, ...]] = {}
    while core.num_unfinished:
        for result in core.step():
            tokens[result.request_id] = result.token_ids
    core.logits_observer = None
    return {rid: (tokens[rid], logits[rid]) for rid in tokens}


def first_difference(alone: Rows, crowd: Rows, ids: Sequence[int]) -> str | None:
    for rid in ids:
        tokens_a, logits_a = alone[rid]
        tokens_c, logits_c = crowd[rid]
        for position, (a, c) in enumerate(zip(logits_a, logits_c, strict=True)):
            if not torch.equal(a, c):
                return f"row {rid}'s logits at generated position {position} changed in a crowd"
        if tokens_a != tokens_c:
            return f"row {rid}'s tokens changed in a crowd"
    return None
