"""The xgrammar implementation of `ConstraintBackend` (imported only when a job has a
constrained row, so unconstrained jobs never load the library).

The tokenizer info is built with the model's vocabulary size (its lm_head may be wider than
the tokenizer: padding ids are then never allowed) and the model's end-of-sequence ids as the
grammar's stop tokens, so a complete output can end exactly where the engine ends rows.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

import torch

from astrai_batch.engine.sampling.constraints.backend import (
    ConstraintBackend,
    ConstraintCompileError,
    Matcher,
)
from astrai_batch.engine.sampling.constraints.schema_keywords import TYPE_KEYWORDS
from astrai_batch.engine.sampling.constraints.schema_support import SchemaSupport
from astrai_batch.engine.sampling.constraints.spec import Constraint
from astrai_batch.errors import ModelLoadError

# xgrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:123: "; users need the rest.
_SOURCE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")
# `json_object` is OpenAI's "any JSON object".
_ANY_OBJECT_SCHEMA = '{"type":"object"}'

# What xgrammar 0.2.8 enforces of JSON Schema, found by experiment (tests/engine/
# test_schema_support.py holds, for every feature left out, an instance its matcher accepts
# and `jsonschema` rejects) and by reading its converter (cpp/json_schema_converter.cc).
# It drops silently: `not`, `if`, `dependentRequired` / `dependentSchemas` / `dependencies`,
# `contains`, `uniqueItems`, `multipleOf` on numbers (and on integers: fractions, values
# over 1024, one bound, bounds over 10000 integers apart), required properties missing from
# `properties`, references outside the schema, every
# keyword beside `$ref` / `const` / `enum` / `anyOf` / `oneOf` / `allOf` (the first of
# them present makes the schema), `allOf` with several schemas (it allows any value), the
# exclusivity of `oneOf` (generated as `anyOf`), the
# type keywords of a schema without `type`, unknown formats, and `pattern`, `minLength`,
# `maxLength` beside a format (and the lengths beside a pattern).
XGRAMMAR_SCHEMA_SUPPORT = SchemaSupport(
    types={
        "string": TYPE_KEYWORDS["string"],
        "integer": TYPE_KEYWORDS["number"],
        "number": TYPE_KEYWORDS["number"] - {"multipleOf"},
        "boolean": frozenset(),
        "null": frozenset(),
        "object": TYPE_KEYWORDS["object"]
        - {"dependentRequired", "dependentSchemas", "dependencies"},
        "array": TYPE_KEYWORDS["array"]
        - {"contains", "minContains", "maxContains", "uniqueItems", "additionalItems"},
    },
    alone=("$ref", "const", "enum", "anyOf", "oneOf", "allOf"),
    inferred={
        "properties": "object",
        "additionalProperties": "object",
        "unevaluatedProperties": "object",
        "items": "array",
        "prefixItems": "array",
        "unevaluatedItems": "array",
    },
    formats=frozenset(
        [
            "email",
            "date",
            "time",
            "date-time",
            "duration",
            "ipv4",
            "ipv6",
            "hostname",
            "uuid",
            "uri",
            "uri-reference",
            "uri-template",
            "json-pointer",
            "relative-json-pointer",
        ]
    ),
    overrides={
        "format": frozenset({"pattern", "minLength", "maxLength"}),
        "pattern": frozenset({"minLength", "maxLength"}),
    },
    max_all_of=1,
    multiple_of_max=1024,
    multiple_of_span=10000,
    required_in_properties=True,
    one_of_as_any_of=True,
)


class ConstraintLibraryMissing(ModelLoadError):
    """The backend library is not installed (a job error, not a row error)."""


class XGrammarMatcher(Matcher):
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def accept(self, token_id: int) -> bool:
        return bool(self.handle.accept_token(token_id))

    @property
    def terminated(self) -> bool:
        return bool(self.handle.is_terminated())


class XGrammarBackend(ConstraintBackend):
    name = "xgrammar"
    schema_support = XGRAMMAR_SCHEMA_SUPPORT

    def __init__(
        self, tokenizer: Any, *, vocab_size: int, eos_token_ids: Collection[int], threads: int = 1
    ) -> None:
        try:
            import xgrammar
        except ImportError:
            raise ConstraintLibraryMissing(
                "rows with an output constraint need the xgrammar library: "
                "pip install 'astrai-batch[structured]'"
            ) from None
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids) or None
        )
        self.vocab_size = vocab_size
        # The library's own cache is off: ours (GrammarCache) keys by constraint digest and
        # also remembers failures.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self._batch = xgrammar.BatchGrammarMatcher(max_threads=threads)

    def compile(self, constraint: Constraint) -> Any:
        kind, text = constraint.kind, constraint.text
        try:
            if kind == "json_schema":
                return self._compiler.compile_json_schema(text, strict_mode=True)
            if kind == "json_object":
                return self._compiler.compile_json_schema(_ANY_OBJECT_SCHEMA, strict_mode=False)
            if kind == "regex":
                return self._compiler.compile_regex(text)
            if kind == "choice":
                return self._compiler.compile_grammar(choice_grammar(constraint.choices))
            return self._compiler.compile_grammar(text)
        except (RuntimeError, ValueError) as exc:
            raise ConstraintCompileError(f"invalid {kind}: {_short_message(exc)}") from None

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def allocate_masks(self, rows: int) -> torch.Tensor:
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill_masks(self, matchers: Sequence[Matcher], masks: torch.Tensor, rows: list[int]) -> None:
        handles = [_handle(m) for m in matchers]
        self._batch.batch_fill_next_token_bitmask(handles, masks, rows)

    def accept_tokens(self, matchers: Sequence[Matcher], token_ids: Sequence[int]) -> list[bool]:
        handles = [_handle(m) for m in matchers]
        return self._xgr.BatchGrammarMatcher.batch_accept_token(handles, list(token_ids))

    def apply_masks(self, scores: torch.Tensor, masks: torch.Tensor, rows: list[int]) -> None:
        if scores.device.type == "cpu":
            self._xgr.apply_token_bitmask_inplace(
                scores, masks, vocab_size=self.vocab_size, indices=rows
            )
            return
        allowed = unpack_masks(masks[rows].to(scores.device), scores.shape[1])
        index = torch.tensor(rows, device=scores.device)
        scores[index] = scores[index].masked_fill(~allowed, float("-inf"))


def choice_grammar(options: Sequence[str]) -> str:
    """An EBNF grammar whose only sentences are the options (JSON string escapes are valid
    EBNF string literals)."""
    import json

    return "root ::= " + " | ".join(json.dumps(option, ensure_ascii=True) for option in options)


def unpack_masks(masks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 bitmasks [R, ceil(V/32)] as booleans [R, vocab_size] (bit j of word w is
    token 32*w + j)."""
    shifts = torch.arange(32, device=masks.device, dtype=torch.int32)
    bits = (masks.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(masks.shape[0], -1)[:, :vocab_size].bool()


def _handle(matcher: Matcher) -> Any:
    if not isinstance(matcher, XGrammarMatcher):
        raise TypeError(f"xgrammar cannot drive a {type(matcher).__name__}")
    return matcher.handle


def _short_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _SOURCE_PREFIX.sub("", text)
