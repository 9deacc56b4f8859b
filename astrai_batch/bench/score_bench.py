"""The scoring benchmark: 4-choice questions over a few shared few-shot contexts.

Our engine scores each row as one scoring request (context once, continuations forked from
it, few-shot prefixes from the prefix cache); the transformers peer scores each (context,
continuation) pair with one forward, pairs sorted by length and batched (right padding,
attention mask), as lm-evaluation-harness's HF backend does. Reported: prefill tokens
computed vs the ideal (the distinct tokens of the prefix tree of every `(context +
continuation)[:-1]`, i.e. each token whose logits or keys anything needs, once), pairs per
second of both, and the largest log-likelihood difference between the two.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from astrai_batch.engine import EngineConfig, GenerationRequest, generate_sync
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.tasks.scoring_types import ScoreRequest
from astrai_batch.errors import AstraiBatchError
from astrai_batch.jobs.planning.task_prefill import ideal_score_tokens

Row = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]


@dataclass(frozen=True)
class ScoreWorkload:
    shots: int = 3  # distinct few-shot contexts
    shot_tokens: int = 400
    questions: int = 16  # per few-shot context
    question_tokens: tuple[int, int] = (40, 90)
    choices: int = 4
    choice_tokens: tuple[int, int] = (2, 10)
    seed: int = 0

    def rows(self, vocab_size: int) -> list[Row]:
        """Rows in an order that interleaves the few-shot contexts (as a benchmark file
        with several subjects would be); the engine's admission finds the shared pages."""
        rng = random.Random(self.seed)

        def tokens(n: int) -> list[int]:
            return [rng.randrange(16, vocab_size) for _ in range(n)]

        shots = [tokens(self.shot_tokens) for _ in range(self.shots)]
        rows = []
        for _ in range(self.questions):
            for s in range(self.shots):
                context = tuple(shots[s] + tokens(rng.randint(*self.question_tokens)))
                conts = tuple(
                    tuple(tokens(rng.randint(*self.choice_tokens))) for _ in range(self.choices)
                )
                rows.append((context, conts))
        return rows


def ideal_tokens(rows: list[Row]) -> int:
    """Distinct nodes of the prefix tree of every pair's model input, (ctx + cont)[:-1]:
    the ideal `astrai-batch plan --task score` reports too."""
    return ideal_score_tokens(rows)


def run_ours(loaded: LoadedModel, rows: list[Row], config: EngineConfig):
    requests = [GenerationRequest(i, ctx, score=ScoreRequest(c)) for i, (ctx, c) in enumerate(rows)]
    started = time.perf_counter()
    results, stats = generate_sync(loaded, requests, config)
    seconds = time.perf_counter() - started
    failed = [r for r in results if r.scores is None]
    if failed:
        raise AstraiBatchError(
            f"{len(failed)} of {len(results)} scoring rows failed, first: {failed[0].error}"
        )
    values = [[s.logprob for s in r.scores] for r in results]
    return values, stats, seconds


def run_peer(model: torch.nn.Module, rows: list[Row], batch_size: int):
    """One forward per (context, continuation) pair, batched by length (longest first, so
    a batch pads little), right padded under an attention mask."""
    pairs = [
        (i, j, ctx, cont) for i, (ctx, conts) in enumerate(rows) for j, cont in enumerate(conts)
    ]
    pairs.sort(key=lambda p: -(len(p[2]) + len(p[3])))
    values = [[0.0] * len(conts) for _, conts in rows]
    started = time.perf_counter()
    with torch.inference_mode():
        for b in range(0, len(pairs), batch_size):
            batch = pairs[b : b + batch_size]
            inputs = [(*ctx, *cont)[:-1] for _, _, ctx, cont in batch]
            width = max(len(x) for x in inputs)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for k, x in enumerate(inputs):
                ids[k, : len(x)] = torch.tensor(x)
                mask[k, : len(x)] = 1
            logits = model(ids.to(model.device), attention_mask=mask.to(model.device)).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for k, (i, j, ctx, cont) in enumerate(batch):
                positions = torch.arange(
                    len(ctx) - 1, len(ctx) - 1 + len(cont), device=logprobs.device
                )
                target = torch.tensor(cont, device=logprobs.device)
                values[i][j] = float(logprobs[k, positions, target].sum())
    return values, time.perf_counter() - started
