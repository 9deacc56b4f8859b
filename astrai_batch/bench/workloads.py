"""Benchmark workloads for `astrai-batch bench`: prompt sets generated from a seed.

Workloads are text, so any tokenizer can run them; `jobs.prefix_stats.ideal_prefix_stats`
(the one prefix-tree count, shared with `plan`) gives their ideal prefix reuse once the
caller has encoded them. Each workload is deterministic for a
seed (see `synthetic_text`), and its rows are shuffled so the runner has to regroup them.

Sizes are in words. With a typical English BPE (measured on SmolLM2's 49k vocabulary) the
built-in vocabulary costs about 1.13 tokens a word in sentences and 1.05 in questions, so
the presets give system prompts of about 250 tokens, questions of 10-40 tokens and
documents of about 1500 tokens. A small tokenizer splits words more (the tests' 384-entry
BPE needs about 4 tokens a word), which lengthens everything but changes no sharing.

Each system prompt and document opens with a distinct random number ("[#48213]"), so
different ones differ within their first few tokens: in the `unique` workload no two rows
share even a 16-token first page unless the chat template itself prepends shared text.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from os import PathLike
from pathlib import Path
from types import MappingProxyType

from astrai_batch.bench import synthetic_text as text
from astrai_batch.checks import require_positive_int
from astrai_batch.errors import ConfigError, OutputError

WORKLOAD_NAMES = ("shared-prefix", "unique", "multi-turn", "long-prefill")


@dataclass(frozen=True)
class WorkloadShape:
    """A workload's sizes with its presets filled in (see `WorkloadSpec`)."""

    num_system_prompts: int
    questions_per_prompt: int
    system_prompt_words: int
    question_words: tuple[int, int]
    max_tokens: int

    @property
    def num_rows(self) -> int:
        return self.num_system_prompts * self.questions_per_prompt


_PRESETS: Mapping[str, WorkloadShape] = MappingProxyType(
    {
        "shared-prefix": WorkloadShape(8, 32, 215, (8, 30), 64),
        "unique": WorkloadShape(8, 32, 215, (8, 30), 64),
        "multi-turn": WorkloadShape(8, 8, 215, (8, 30), 64),
        "long-prefill": WorkloadShape(4, 1, 1330, (8, 30), 16),
    }
)


@dataclass(frozen=True)
class WorkloadSpec:
    """Which workload to generate; a size left as None takes the workload's preset.

    * `shared-prefix`: `num_system_prompts` system prompts (preset 8), each shared by
      `questions_per_prompt` questions (preset 32); rows are [system, user] messages.
    * `unique`: as many rows with the same lengths, each with its own system prompt.
    * `multi-turn`: `num_system_prompts` conversations (preset 8) of `questions_per_prompt`
      turns (preset 8). Row k is the conversation up to the k-th user turn, the assistant
      turns before it being synthetic text, so row k+1's prompt extends row k's.
    * `long-prefill`: `num_system_prompts` documents (preset 4) of `system_prompt_words`
      (preset 1330), each with `questions_per_prompt` questions (preset 1) and
      `max_tokens` 16; rows are plain prompts "document, Question: ..., Answer:".
    """

    name: str
    seed: int = 0
    num_system_prompts: int | None = None
    questions_per_prompt: int | None = None
    system_prompt_words: int | None = None
    question_words: tuple[int, int] | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.name not in WORKLOAD_NAMES:
            raise ConfigError(f"name must be one of {', '.join(WORKLOAD_NAMES)}; got {self.name!r}")
        if not _is_int(self.seed):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        for field_name in (
            "num_system_prompts",
            "questions_per_prompt",
            "system_prompt_words",
            "max_tokens",
        ):
            value = getattr(self, field_name)
            if value is not None:
                require_positive_int(field_name, value)
        words = self.question_words
        if words is not None and not (
            isinstance(words, tuple)
            and len(words) == 2
            and all(_is_int(bound) for bound in words)
            and 1 <= words[0] <= words[1]
        ):
            raise ConfigError(
                f"question_words must be a pair (low, high) of integers with 1 <= low <= high,"
                f" got {words!r}"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> WorkloadSpec:
        """Build from a dict (TOML, JSON, CLI options); unknown keys are an error."""
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown workload keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        if "name" not in values:
            raise ConfigError("name is required")
        converted = dict(values)
        if isinstance(converted.get("question_words"), list):
            converted["question_words"] = tuple(converted["question_words"])
        return cls(**converted)  # type: ignore[arg-type]

    def shape(self) -> WorkloadShape:
        """The sizes this spec generates: its own where given, the workload's preset otherwise."""
        preset = _PRESETS[self.name]
        return WorkloadShape(
            num_system_prompts=_or(self.num_system_prompts, preset.num_system_prompts),
            questions_per_prompt=_or(self.questions_per_prompt, preset.questions_per_prompt),
            system_prompt_words=_or(self.system_prompt_words, preset.system_prompt_words),
            question_words=self.question_words or preset.question_words,
            max_tokens=_or(self.max_tokens, preset.max_tokens),
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _or(value: int | None, preset: int) -> int:
    return preset if value is None else value


@dataclass(frozen=True)
class WorkloadRow:
    """One prompt: chat `messages` ({"role", "content"} dicts) or a plain `prompt`."""

    id: str
    messages: tuple[dict[str, str], ...] | None
    prompt: str | None
    max_tokens: int

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ConfigError(f"row {self.id!r}: exactly one of messages and prompt must be set")
        if self.max_tokens < 1:
            raise ConfigError(f"row {self.id!r}: max_tokens must be >= 1, got {self.max_tokens}")

    def to_json_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"id": self.id}
        if self.messages is not None:
            body["messages"] = [dict(message) for message in self.messages]
        else:
            body["prompt"] = self.prompt
        body["max_tokens"] = self.max_tokens
        return body


def build_workload(spec: WorkloadSpec) -> list[WorkloadRow]:
    """The rows of the workload `spec` names, shuffled with its seed."""
    shape = spec.shape()
    rng = random.Random(spec.seed)
    codes = _distinct_codes(rng, _num_openings(spec.name, shape))
    if spec.name == "shared-prefix":
        rows = _shared_prefix(rng, shape, codes)
    elif spec.name == "unique":
        rows = _unique(rng, shape, codes)
    elif spec.name == "multi-turn":
        rows = _multi_turn(rng, shape, codes)
    else:
        rows = _long_prefill(rng, shape, codes)
    rng.shuffle(rows)
    return rows


def _num_openings(name: str, shape: WorkloadShape) -> int:
    return shape.num_rows if name == "unique" else shape.num_system_prompts


def _distinct_codes(rng: random.Random, count: int) -> list[str]:
    width = max(5, len(str(count)) + 1)
    return [str(code) for code in rng.sample(range(10 ** (width - 1), 10**width), count)]


def _system_prompt(rng: random.Random, shape: WorkloadShape, code: str) -> str:
    opening = text.persona(rng, f"[#{code}]")
    body = text.paragraph(rng, max(1, shape.system_prompt_words - len(opening.split())))
    return f"{opening} {body}"


def _question(rng: random.Random, shape: WorkloadShape) -> str:
    return text.question(rng, rng.randint(*shape.question_words))


def _chat(system: str, *turns: str) -> tuple[dict[str, str], ...]:
    roles = ("user", "assistant")
    messages = [{"role": "system", "content": system}]
    messages += [{"role": roles[index % 2], "content": turn} for index, turn in enumerate(turns)]
    return tuple(messages)


def _shared_prefix(rng: random.Random, shape: WorkloadShape, codes: list[str]) -> list[WorkloadRow]:
    rows = []
    for group, code in enumerate(codes):
        system = _system_prompt(rng, shape, code)
        for index in range(shape.questions_per_prompt):
            messages = _chat(system, _question(rng, shape))
            rows.append(
                WorkloadRow(
                    f"shared-prefix-{group:04d}-{index:04d}", messages, None, shape.max_tokens
                )
            )
    return rows


def _unique(rng: random.Random, shape: WorkloadShape, codes: list[str]) -> list[WorkloadRow]:
    return [
        WorkloadRow(
            f"unique-{index:05d}",
            _chat(_system_prompt(rng, shape, code), _question(rng, shape)),
            None,
            shape.max_tokens,
        )
        for index, code in enumerate(codes)
    ]


def _multi_turn(rng: random.Random, shape: WorkloadShape, codes: list[str]) -> list[WorkloadRow]:
    rows = []
    for conversation, code in enumerate(codes):
        system = _system_prompt(rng, shape, code)
        turns: list[str] = []
        for turn in range(1, shape.questions_per_prompt + 1):
            if turns:
                turns.append(text.paragraph(rng, rng.randint(*shape.question_words)))
            turns.append(_question(rng, shape))
            rows.append(
                WorkloadRow(
                    f"multi-turn-{conversation:04d}-{turn:04d}",
                    _chat(system, *turns),
                    None,
                    shape.max_tokens,
                )
            )
    return rows


def _long_prefill(rng: random.Random, shape: WorkloadShape, codes: list[str]) -> list[WorkloadRow]:
    rows = []
    for document_index, code in enumerate(codes):
        document = f"[#{code}] " + text.paragraph(rng, shape.system_prompt_words)
        for index in range(shape.questions_per_prompt):
            prompt = f"{document}\n\nQuestion: {_question(rng, shape)}\nAnswer:"
            rows.append(
                WorkloadRow(
                    f"long-prefill-{document_index:04d}-{index:04d}", None, prompt, shape.max_tokens
                )
            )
    return rows


def write_workload_jsonl(rows: Iterable[WorkloadRow], path: str | PathLike[str]) -> None:
    """One JSON object a line: {"id", "messages" or "prompt", "max_tokens"}."""
    target = Path(path)
    try:
        with target.open("w", encoding="utf-8", newline="\n") as stream:
            for row in rows:
                stream.write(json.dumps(row.to_json_dict(), ensure_ascii=False) + "\n")
    except OSError as exc:
        raise OutputError(f"cannot write the workload to {target}: {exc}") from exc
