"""What goes into the engine and what comes out."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from astrai_batch.cache import CacheStats
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.prompt_logprobs import TokenLogprob
from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.engine.tasks.scoring_types import ContinuationScore, ScoreRequest

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt, already tokenized. `n` samples come back as n results.

    An unseeded sampled request draws from a generator seeded by the engine seed, `seed_key`
    (the request id when None) and the sample index: jobs pass the row's id, so a row keeps
    its samples when its dataset is split, sharded or reordered. `adapter` names a LoRA adapter
    installed in the model (`engine.lora.bank`); None is the base model.
    """

    request_id: Hashable
    prompt_token_ids: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seed_key: Hashable | None = None
    adapter: str | None = None
    # a scoring request: no decode, `GenerationResult.scores` per continuation (`scoring`)
    score: ScoreRequest | None = None
    # an embedding request: no decode, `GenerationResult.embedding` (`embedding`)
    embed: EmbedRequest | None = None
    # a vision-language model's images (`engine.vision.image_inputs.image_prompt`): their
    # placeholder positions in `prompt_token_ids` hold the images' content ids
    images: tuple = ()

    def __post_init__(self) -> None:
        # one answer comes back for a request that decodes nothing: a caller waiting for n
        # of them would wait forever
        if (self.score is not None or self.embed is not None) and self.params.n != 1:
            raise ValueError(f"a scoring or embedding request takes n=1, got n={self.params.n}")
        if self.images and (self.score is not None or self.embed is not None):
            raise ValueError("a scoring or embedding request takes no images")


@dataclass(frozen=True)
class Timings:
    queued_seconds: float  # from submission to first admission
    first_token_seconds: float | None  # from submission to the first sampled token
    total_seconds: float  # from submission to finish


@dataclass(frozen=True)
class GenerationResult:
    request_id: Hashable
    sample_index: int
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache at first admission
    completion_tokens: int
    logprobs: tuple[float, ...] | None = None
    error: str | None = None
    timings: Timings | None = None
    scores: tuple[ContinuationScore, ...] | None = None  # a scoring request's answer
    # per prompt token (the first None) its TokenLogprob, with `params.prompt_logprobs`
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    # per generated token its TokenLogprob, with `params.top_logprobs`
    top_logprobs: tuple[TokenLogprob, ...] | None = None
    # the text of every token id in prompt_logprobs / top_logprobs (each token decoded alone)
    token_texts: Mapping[int, str] | None = None
    embedding: tuple[float, ...] | None = None  # an embedding request's answer


@dataclass(frozen=True)
class EngineStats:
    steps: int
    prefill_tokens: int  # prompt (and recomputed) tokens run through the model
    decode_tokens: int  # tokens sampled
    preemptions: int
    requests_finished: int
    requests_failed: int
    forward_seconds: float  # inside the model forward
    busy_seconds: float  # inside engine steps (forward + scheduling + sampling)
    cache: CacheStats
    constrained_requests: int = 0  # requests with a constraint (compiled or failed)
    grammars_compiled: int = 0  # distinct constraints compiled (cache misses)
    grammar_compile_seconds: float = 0.0
    mask_fill_seconds: float = 0.0  # filling grammar masks (worker thread, beside the forward)
    mask_wait_seconds: float = 0.0  # the step waited for masks after its forward
    images_encoded: int = 0  # images run through a vision tower
    image_encodes_saved: int = 0  # image features served by the encoder cache instead
    image_tokens_cached: int = 0  # image placeholder tokens served from the prefix cache

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "cache"}
        out["cache"] = self.cache.to_dict()
        return out

    def __sub__(self, other: EngineStats) -> EngineStats:
        return EngineStats(
            steps=self.steps - other.steps,
            prefill_tokens=self.prefill_tokens - other.prefill_tokens,
            decode_tokens=self.decode_tokens - other.decode_tokens,
            preemptions=self.preemptions - other.preemptions,
            requests_finished=self.requests_finished - other.requests_finished,
            requests_failed=self.requests_failed - other.requests_failed,
            forward_seconds=self.forward_seconds - other.forward_seconds,
            busy_seconds=self.busy_seconds - other.busy_seconds,
            cache=self.cache - other.cache,
            constrained_requests=self.constrained_requests - other.constrained_requests,
            grammars_compiled=self.grammars_compiled - other.grammars_compiled,
            grammar_compile_seconds=self.grammar_compile_seconds - other.grammar_compile_seconds,
            mask_fill_seconds=self.mask_fill_seconds - other.mask_fill_seconds,
            mask_wait_seconds=self.mask_wait_seconds - other.mask_wait_seconds,
            images_encoded=self.images_encoded - other.images_encoded,
            image_encodes_saved=self.image_encodes_saved - other.image_encodes_saved,
            image_tokens_cached=self.image_tokens_cached - other.image_tokens_cached,
        )


def error_result(
    request: GenerationRequest, message: str, sample_index: int = 0
) -> GenerationResult:
    return GenerationResult(
        request_id=request.request_id,
        sample_index=sample_index,
        token_ids=(),
        text="",
        finish_reason="error",
        prompt_tokens=len(request.prompt_token_ids),
        cached_tokens=0,
        completion_tokens=0,
        error=message,
    )


def as_token_tuple(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in ids)
