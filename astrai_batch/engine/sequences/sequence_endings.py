"""How a sequence ends: the finish reason a sampled token gives it (a stop string, a complete
grammar, a stop id or EOS, the length limit), and the `GenerationResult` it then becomes."""

from __future__ import annotations

import time

from astrai_batch.engine.sampling.constraints.sequence_matchers import SequenceMatchers
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.engine.sampling.prompt_logprobs import prompt_results, token_texts
from astrai_batch.engine.sampling.stop_strings import StopStringTracker
from astrai_batch.engine.sequences.sequence import Sequence
from astrai_batch.engine.types import FinishReason, GenerationResult, Timings


class SequenceEndings:
    """The stop-string trackers of the live sequences that have stop strings, beside the
    engine's grammar matchers (`constraints`): the two things besides a token id that can
    end a sequence. A tracker also holds the text cut at its stop string, which becomes the
    result's text."""

    def __init__(self, tokenizer, constraints: SequenceMatchers) -> None:
        self.tokenizer = tokenizer
        self.constraints = constraints
        self._stop_texts: dict[int, StopStringTracker] = {}

    def watch(self, seq_id: int, params: SamplingParams) -> None:
        """Starts tracking a new sequence's text, when its params have stop strings."""
        if params.stop:
            self._stop_texts[seq_id] = StopStringTracker(
                self.tokenizer, params.stop, params.min_tokens
            )

    def reason(self, seq: Sequence, token: int) -> FinishReason | None:
        """Why `token`, just appended to `seq`, ends it, or None when it does not."""
        num_tokens = len(seq.tokens)
        generated = num_tokens - len(seq.prompt_token_ids)
        output = self._stop_texts.get(seq.seq_id)
        if output is not None and output.append(token):
            return "stop"
        if self.constraints.terminated(seq.seq_id):
            return "stop"  # the grammar is complete and accepted an end token
        # min_tokens holds off every stop: stop strings in the tracker, stop ids and EOS (unless
        # ignored: the sampler's early-stop ids) here; the sampler masks them too, so the first
        # that can end a row is token min_tokens + 1.
        if generated > seq.params.min_tokens and token in seq.sampler.early_stop_ids:
            return "stop"
        if num_tokens >= seq.length_limit:  # max_tokens, or the model's context
            return "length"
        return None

    def result(self, seq: Sequence, reason: FinishReason) -> GenerationResult:
        """The result of a finished sequence; forgets its tracker."""
        output = self._stop_texts.pop(seq.seq_id, None)
        ids = seq.output_token_ids
        if output is not None and output.cut is not None:
            text = output.text
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        now = time.perf_counter()
        prompt_logprobs = prompt_results(seq.targets)
        top_logprobs = tuple(seq.top_logprobs) if seq.params.top_logprobs else None
        return GenerationResult(
            request_id=seq.request_id,
            sample_index=seq.sample_index,
            token_ids=tuple(ids),
            text=text,
            finish_reason=reason,
            prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached_tokens or 0,
            completion_tokens=len(ids),
            logprobs=tuple(seq.logprobs) if seq.params.logprobs else None,
            prompt_logprobs=prompt_logprobs,
            top_logprobs=top_logprobs,
            token_texts=token_texts(self.tokenizer, prompt_logprobs, top_logprobs),
            timings=Timings(
                queued_seconds=(seq.admitted_at or now) - seq.submitted_at,
                first_token_seconds=(
                    seq.first_token_at - seq.submitted_at if seq.first_token_at else None
                ),
                total_seconds=now - seq.submitted_at,
            ),
        )
