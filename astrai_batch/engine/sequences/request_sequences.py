"""A generation request's samples as sequences: one `Sequence` per sample, each with its own
sampler, seed and prompt-logprob targets."""

from __future__ import annotations

from collections.abc import Collection, Iterator

from astrai_batch.engine.request_checks import fallback_seed
from astrai_batch.engine.sampling.prompt_logprobs import prompt_targets
from astrai_batch.engine.sampling.sequence_sampler import SequenceSampler
from astrai_batch.engine.sequences.sequence import Sequence
from astrai_batch.engine.tasks.task_requests import RequestCounts
from astrai_batch.engine.types import GenerationRequest


def request_sequences(
    request: GenerationRequest,
    prompt: tuple[int, ...],
    *,
    adapter: int,
    counts: RequestCounts,
    eos_token_ids: Collection[int],
    engine_seed: int,
    page_size: int,
    max_model_len: int,
    real_prompt: tuple[int, ...] | None = None,
    images: tuple = (),
) -> Iterator[Sequence]:
    """The request's `params.n` sequences, lazily: each takes its id from `counts` as the
    caller gets it. An unseeded sample's seed comes from the engine seed, the request's seed
    key and the sample index (see `GenerationRequest`). `real_prompt`: the prompt with its
    images' content ids back to the image token id (what the sampler's penalties and the
    prompt-logprob targets see, as in transformers); None when it has no images. `images`:
    the request's images with their pixels in memory (`ImageInput.materialized`)."""
    seen = prompt if real_prompt is None else real_prompt
    params = request.params
    seed_key = request.request_id if request.seed_key is None else request.seed_key
    for sample_index in range(params.n):
        sampler = SequenceSampler(
            params,
            seen,
            sample_index=sample_index,
            eos_token_ids=eos_token_ids,
            fallback_seed=fallback_seed(engine_seed, seed_key, sample_index),
        )
        seq = Sequence(
            seq_id=counts.new_seq_id(),
            request_id=request.request_id,
            sample_index=sample_index,
            prompt_token_ids=prompt,
            params=params,
            sampler=sampler,
            arrival=counts.arrivals,
            page_size=page_size,
            max_model_len=max_model_len,
            adapter=adapter,
            images=images,
        )
        seq.targets = prompt_targets(seen, params.prompt_logprobs)
        yield seq
