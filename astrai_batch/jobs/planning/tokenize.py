"""Turning input rows into prompt token ids, in batches, with the model's own tokenizer.

- ``prompt`` rows are encoded as they are, with the tokenizer's default special tokens (a
  BOS where the tokenizer adds one);
- ``messages`` rows are rendered with the chat template (``add_generation_prompt=True``)
  and the rendered text is encoded without adding special tokens again, since the template
  already writes them (this is what vLLM and transformers' own ``tokenize=True`` do). The
  template also sees the job's ``--chat-template-kwargs`` with the row's own
  ``chat_template_kwargs`` merged over them (e.g. ``enable_thinking``); a name that is an
  argument of ``apply_chat_template`` itself (``tokenize``, ``add_generation_prompt``, ...)
  is refused, since it would change the call rather than reach the template; an OpenAI
  line's tools go to the template's ``tools`` argument;
- ``prompt_token_ids`` rows are used unchanged; the engine checks them against the vocab;
- an OpenAI completions line of several prompts (an embeddings line of several inputs) has
  each after the first encoded as the first (`Encoding.extra`).

`run` and `plan` share this code, so `plan` predicts exactly the prompts `run` sends.
Encoding is CPU work in Rust; callers run `PromptEncoder.encode` in a worker thread.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astrai_batch.engine.model.support import has_chat_template, no_chat_template_message
from astrai_batch.errors import AstraiBatchError, ConfigError
from astrai_batch.io import InputRow
from astrai_batch.io.image_cells import CellReader
from astrai_batch.io.image_sources import ImageLimits
from astrai_batch.jobs.planning.image_encoding import encode_image_row

ENCODE_BATCH_ROWS = 2048


@dataclass(frozen=True)
class Encoding:
    """The prompt token ids of one row, or why it has none. Exactly one is set."""

    token_ids: tuple[int, ...] | None = None
    error: str | None = None
    # the token ids of an OpenAI line's prompts after the first (`InputRow.extra_prompts`)
    extra: tuple[tuple[int, ...], ...] = ()
    # a vision-language model's images of the row (`engine.vision.image_inputs.ImageInput`):
    # their placeholders in `token_ids` hold content ids (`image_encoding`)
    images: tuple = ()

    def __post_init__(self) -> None:
        if (self.token_ids is None) == (self.error is None):
            raise ValueError("exactly one of token_ids and error must be set")


def text_only_message(model_name: str) -> str:
    """A row with images on a model that reads text only."""
    return f"the row has images, but model {model_name!r} reads text only (use a vision model)"


def template_call_arguments(tokenizer: Any) -> frozenset[str]:
    """The named arguments of the tokenizer's ``apply_chat_template``: chat template
    variables cannot use these names."""
    method = getattr(tokenizer, "apply_chat_template", None)
    if method is None:
        return frozenset()
    parameters = inspect.signature(method).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD)


def reserved_names_message(field_name: str, names: Sequence[str]) -> str | None:
    if not names:
        return None
    listed = ", ".join(repr(name) for name in sorted(names))
    return f"{field_name} cannot set {listed}: an argument of the chat template call"


class PromptEncoder:
    """Encodes `InputRow`s with one tokenizer; never raises for a bad row.

    `chat_template_kwargs` are the job-wide chat template variables; ConfigError when one
    of them is an argument of ``apply_chat_template`` itself. `vision`: the model's
    `VisionTower` (its processor prepares rows with images, its chat template renders every
    chat row); None for a text model, where a row with images is an error.
    """

    def __init__(
        self,
        tokenizer: Any,
        model_name: str,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        vision: Any = None,
        image_limits: ImageLimits | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.vision = vision
        self.image_limits = image_limits or ImageLimits()
        # reads a waiting row's Parquet image cells again when its request enters the engine
        self.image_cells = CellReader()
        # one int object per vocabulary id for every row's token ids: a tokenizer makes a new
        # one per token (28 bytes), which a window of waiting rows would keep once per token
        self._token_ints: dict[int, int] = {}
        self._vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else 0
        # the error of a row with images where no vision tower is given: a text model's
        self.images_refused = text_only_message(model_name)
        processor = None if vision is None else vision.processor
        # a processor's own chat template (saved apart from the tokenizer's) renders chats
        self._templater = (
            processor if processor is not None and has_chat_template(processor) else tokenizer
        )
        self.has_chat_template = has_chat_template(self._templater)
        self._reserved = template_call_arguments(tokenizer)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        problem = reserved_names_message(
            "--chat-template-kwargs", [n for n in self.chat_template_kwargs if n in self._reserved]
        )
        if problem is not None:
            raise ConfigError(problem)

    def encode(self, rows: Sequence[InputRow]) -> list[Encoding]:
        """One `Encoding` per row, in order. Rows that carry an error keep it."""
        out: list[Encoding] = []
        for start in range(0, len(rows), ENCODE_BATCH_ROWS):
            out.extend(self._encode_batch(rows[start : start + ENCODE_BATCH_ROWS]))
        return out

    def _encode_batch(self, rows: Sequence[InputRow]) -> list[Encoding]:
        results: list[Encoding | None] = [None] * len(rows)
        plain: list[tuple[int, str]] = []  # (position, text) encoded with special tokens
        rendered: list[tuple[int, str]] = []  # chat text: the template wrote the specials
        for position, row in enumerate(rows):
            if row.error is not None:
                results[position] = Encoding(error=row.error)
            elif row.prompt_token_ids is not None:
                results[position] = Encoding(token_ids=self._shared(row.prompt_token_ids))
            elif row.prompt is not None:
                plain.append((position, row.prompt))
            else:
                text_or_error = self._render_chat(row)
                if isinstance(text_or_error, Encoding):
                    results[position] = text_or_error
                elif row.images:
                    results[position] = self._encode_images(row, text_or_error)
                else:
                    rendered.append((position, text_or_error))
        for items, special in ((plain, True), (rendered, False)):
            for position, encoding in zip(
                (position for position, _ in items),
                self._encode_texts([text for _, text in items], special),
                strict=True,
            ):
                results[position] = encoding
        for position, row in enumerate(rows):
            current = results[position]
            if row.extra_prompts and current is not None and current.token_ids is not None:
                results[position] = self._with_extra(current, row.extra_prompts)
        encoded = [result for result in results if result is not None]
        if len(encoded) != len(rows):
            raise AstraiBatchError(f"encoded {len(encoded)} of {len(rows)} rows; this is a bug")
        return encoded

    def _with_extra(self, first: Encoding, prompts: Sequence[str | tuple[int, ...]]) -> Encoding:
        """A row of several prompts: each after the first encoded as the first was (texts
        with the tokenizer's special tokens, token ids unchanged)."""
        texts = [prompt for prompt in prompts if isinstance(prompt, str)]
        encoded = iter(self._encode_texts(texts, True))
        extra = []
        for number, prompt in enumerate(prompts, start=1):
            encoding = None
            if not isinstance(prompt, str):
                encoding = Encoding(token_ids=self._shared(prompt))
            encoding = encoding or next(encoded)
            if encoding.error is not None:
                return Encoding(error=f"prompt {number}: {encoding.error}")
            extra.append(encoding.token_ids or ())
        return Encoding(token_ids=first.token_ids, extra=tuple(extra))

    def render_chat(self, row: InputRow) -> str | Encoding:
        """A messages row's rendered chat text, or the Encoding carrying its error."""
        return self._render_chat(row)

    def _render_chat(self, row: InputRow) -> str | Encoding:
        if row.images and self.vision is None:
            # a text tokenizer cannot place an image's tokens: never drop them silently
            return Encoding(error=self.images_refused)
        if not self.has_chat_template:
            return Encoding(error=no_chat_template_message(self.model_name))
        own = row.chat_template_kwargs or {}
        problem = reserved_names_message(
            "chat_template_kwargs", [name for name in own if name in self._reserved]
        )
        if problem is not None:
            return Encoding(error=problem)
        try:
            tools = {"tools": [dict(tool) for tool in row.tools]} if row.tools else {}
            text = self._templater.apply_chat_template(
                [dict(message) for message in row.messages or ()],
                add_generation_prompt=True,
                tokenize=False,
                **tools,
                **{**self.chat_template_kwargs, **own},
            )
        except Exception as exc:  # a template may raise anything (jinja errors, its own checks)
            return Encoding(error=f"chat template failed: {_one_line(exc)}")
        if not isinstance(text, str):
            return Encoding(error=f"chat template returned {type(text).__name__}, not text")
        return text

    def _encode_images(self, row: InputRow, text: str) -> Encoding:
        encoded = encode_image_row(
            self.vision, self.model_name, text, row.images, self.image_limits, self.image_cells
        )
        if isinstance(encoded, str):
            return Encoding(error=encoded)
        return Encoding(token_ids=self._shared(encoded[0]), images=encoded[1])

    def _encode_texts(self, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        if not texts:
            return []
        try:
            batch = self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
        except Exception:
            # One bad text fails the whole batch; encode one by one to find it.
            return [self._encode_one(text, add_special_tokens) for text in texts]
        return [self._encoding_of(ids) for ids in batch]

    def _encode_one(self, text: str, add_special_tokens: bool) -> Encoding:
        try:
            ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        except Exception as exc:
            return Encoding(error=f"tokenization failed: {_one_line(exc)}")
        return self._encoding_of(ids)

    def _encoding_of(self, ids: Sequence[int]) -> Encoding:
        if not ids:
            return Encoding(error="prompt is empty after tokenization")
        return Encoding(token_ids=self._shared(ids))

    def _shared(self, ids: Sequence[int]) -> tuple[int, ...]:
        """`ids` as a tuple of the encoder's int objects for vocabulary ids (others, such as
        an image's negative content ids or an id the engine will refuse, as they are)."""
        table, vocab = self._token_ints, self._vocab_size
        return tuple(
            table.setdefault(token, token) if 0 <= token < vocab else token
            for token in map(int, ids)
        )


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
