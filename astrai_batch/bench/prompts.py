"""The benchmark's prompt set: token ids every system receives, and its ideal prefix reuse.

Prompts are encoded once, with the same `PromptEncoder` the `run` command uses (chat rows
through the tokenizer's chat template with the generation prompt), so the engine and the
peers see the very same token ids and `run` would see them too.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_batch.bench.config import BenchConfig
from astrai_batch.bench.workloads import WORKLOAD_NAMES, WorkloadRow, WorkloadSpec, build_workload
from astrai_batch.errors import InputError
from astrai_batch.io import InputRow, open_input
from astrai_batch.jobs.planning.prefix_stats import PrefixStats, ideal_prefix_stats
from astrai_batch.jobs.planning.tokenize import PromptEncoder

FILE_MAX_TOKENS = 64


@dataclass(frozen=True)
class BenchPrompts:
    """Encoded prompts in input order, one `max_tokens` for all, and the ideal reuse."""

    workload: str  # a built-in workload name or the input file's path
    prompt_token_ids: tuple[tuple[int, ...], ...]
    max_tokens: int
    ideal: PrefixStats

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise InputError(f"workload {self.workload!r} has no prompts")
        if self.max_tokens < 1:
            raise InputError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def fingerprint(self) -> str:
        """Identifies the work: equal token ids and max_tokens, equal fingerprint."""
        digest = hashlib.sha256(str(self.max_tokens).encode())
        for ids in self.prompt_token_ids:
            digest.update(b"\n" + ",".join(map(str, ids)).encode())
        return digest.hexdigest()[:16]

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_token_ids)

    @property
    def generated_tokens(self) -> int:
        """Every system generates exactly `max_tokens` per prompt (end-of-sequence ignored)."""
        return self.num_prompts * self.max_tokens

    def head(self, num_prompts: int, max_tokens: int) -> BenchPrompts:
        """The first prompts with fewer tokens to generate: the warm-up's prompt set."""
        kept = self.prompt_token_ids[:num_prompts]
        return BenchPrompts(
            workload=self.workload,
            prompt_token_ids=kept,
            max_tokens=min(max_tokens, self.max_tokens),
            ideal=ideal_prefix_stats(kept, page_size=self.ideal.page_size),
        )


def load_prompts(config: BenchConfig, tokenizer: Any, model_name: str) -> BenchPrompts:
    """Builds (or reads) the workload `config` names and encodes it with `tokenizer`."""
    if config.workload in WORKLOAD_NAMES:
        spec = WorkloadSpec(
            name=config.workload,
            seed=config.seed,
            num_system_prompts=config.num_system_prompts,
            questions_per_prompt=config.questions_per_prompt,
            system_prompt_words=config.system_prompt_words,
            max_tokens=config.max_tokens,
        )
        rows = [_input_row(index, row) for index, row in enumerate(build_workload(spec))]
        max_tokens = spec.shape().max_tokens
    else:
        path = Path(config.workload)
        if not path.exists():
            raise InputError(
                f"workload {config.workload!r} is neither a built-in workload "
                f"({', '.join(WORKLOAD_NAMES)}) nor an existing input file"
            )
        rows = list(open_input(path).iter_rows())
        max_tokens = config.max_tokens or FILE_MAX_TOKENS
    encodings = PromptEncoder(tokenizer, model_name).encode(rows)
    token_ids = []
    for row, encoding in zip(rows, encodings, strict=True):
        if encoding.token_ids is None:
            raise InputError(f"workload row {row.id!r} cannot be benchmarked: {encoding.error}")
        token_ids.append(encoding.token_ids)
    return BenchPrompts(
        workload=config.workload,
        prompt_token_ids=tuple(token_ids),
        max_tokens=max_tokens,
        ideal=ideal_prefix_stats(token_ids, page_size=config.engine.page_size),
    )


def _input_row(index: int, row: WorkloadRow) -> InputRow:
    return InputRow(index=index, id=row.id, prompt=row.prompt, messages=row.messages)


def random_shared_prefix_ids(
    systems: int, questions: int, system_tokens: int, question_tokens: int, vocab: int
) -> list[tuple[int, ...]]:
    """The shared-prefix workload as random token ids (no tokenizer): `systems` prefixes of
    `system_tokens`, each followed by `questions` tails of `question_tokens`, shuffled."""
    rng = random.Random(11)
    prompts = []
    for _ in range(systems):
        system = [rng.randrange(3, vocab) for _ in range(system_tokens)]
        for _ in range(questions):
            prompts.append(
                tuple(system + [rng.randrange(3, vocab) for _ in range(question_tokens)])
            )
    rng.shuffle(prompts)
    return prompts
