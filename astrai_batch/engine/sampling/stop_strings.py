"""Completion text as tokens arrive, and stop strings found in it.

The engine decodes each sequence's output incrementally (`IncrementalDetokenizer`) and, after
every token, asks `StopStringMatcher.find` whether a stop string has appeared in the text that
is new since the last check (`StopStringTracker` ties the two together per sequence). Both
cost a small window per token, not the whole output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from astrai_batch.errors import ConfigError

REPLACEMENT_CHAR = "\ufffd"

# Prompt tokens kept as decoding context: enough for a UTF-8 character (4 bytes) split over
# byte tokens and for SentencePiece's leading-space rule.
PROMPT_CONTEXT_TOKENS = 6


class StopStringMatcher:
    """Finds the earliest stop string in a growing text, checking only what is new."""

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            raise ConfigError(f"stop must be a sequence of strings, got the string {stops!r}")
        for stop in stops:
            if not isinstance(stop, str) or not stop:
                raise ConfigError(f"stop must contain only non-empty strings, got {stop!r}")
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self.max_stop_len: int = max((len(stop) for stop in self.stops), default=0)

    def find(self, text: str, start: int = 0) -> int | None:
        """Where to cut `text` (the start of the earliest stop string), or None.

        `start` is the length of the text already checked: only occurrences that end after it
        are looked for, so a stop string spanning the old end and the new text is found, and
        one lying wholly in the checked part (already reported) is not. When several stop
        strings occur, the one starting first wins.
        """
        if not 0 <= start <= len(text):
            raise ValueError(f"start must be in [0, {len(text)}], got {start}")
        earliest: int | None = None
        for stop in self.stops:
            position = text.find(stop, max(0, start - len(stop) + 1))
            if position != -1 and (earliest is None or position < earliest):
                earliest = position
        return earliest


class TokenDecoder(Protocol):
    """The part of a Hugging Face tokenizer the detokenizer uses."""

    def decode(
        self, token_ids: list[int], skip_special_tokens: bool, clean_up_tokenization_spaces: bool
    ) -> str: ...


# Where Hugging Face's stock fast tokenizers define `decode` and `_decode` (transformers 5,
# and 4): with both stock, `decode(ids, skip_special_tokens=True,
# clean_up_tokenization_spaces=False)` is exactly the Rust tokenizer's own `decode`.
STOCK_DECODE_MODULES = frozenset({"transformers.tokenization_utils_base"})
STOCK_FAST_DECODE_MODULES = frozenset(
    {"transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast"}
)


def window_decoder(tokenizer: TokenDecoder) -> Callable[[list[int]], str]:
    """`ids -> text` as the detokenizer decodes a window: special tokens skipped, no clean-up.

    For a stock fast tokenizer, the Rust tokenizer is called directly: its Python wrapper is
    about three quarters of the call at a window of a few tokens (1.0 vs 3.4 microseconds
    measured), and a sequence with stop strings decodes up to two windows per token.
    Anything else (a slow tokenizer, remote code, a subclass with its own decoding) goes
    through `decode`.
    """
    kind = type(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decode = getattr(kind, "decode", None)
    inner = getattr(kind, "_decode", None)
    if (
        backend is not None
        and getattr(decode, "__module__", None) in STOCK_DECODE_MODULES
        and getattr(inner, "__module__", None) in STOCK_FAST_DECODE_MODULES
    ):
        fast = backend.decode
        return lambda ids: fast(ids, skip_special_tokens=True)

    def through_decode(ids: list[int]) -> str:
        # No clean-up: it rewrites spaces next to punctuation across the whole string, which
        # window-by-window decoding cannot reproduce.
        return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    return through_decode


class IncrementalDetokenizer:
    """Decodes a sequence's output token by token, decoding only a few recent tokens each time.

    The usual prefix/read-offset scheme (as in vLLM and TGI): the text of the new tokens is
    `decode(window)[len(decode(prefix)):]`, where the prefix is the token(s) emitted last, so
    tokenizers whose decoding of a token depends on its left neighbour (SentencePiece spaces,
    byte-level BPE) come out right. Text whose decoding ends in U+FFFD is held back until a
    later token completes the character.

    `text` is the stable text (all that `append` returned); `full_text` adds what the held-back
    tokens decode to now. With no prompt context, `full_text` always equals
    `tokenizer.decode(generated_ids, skip_special_tokens=True, clean_up_tokenization_spaces=
    False)`. Prompt context makes it the text as it continues the prompt (a SentencePiece
    output can then start with a space that decoding the output alone would drop).

    A run of tokens that keeps the text ending in U+FFFD (invalid bytes) grows the window until
    it resolves; real text holds back at most the 1-3 tokens of one character.
    """

    def __init__(self, tokenizer: TokenDecoder, prompt_token_ids: Sequence[int] = ()) -> None:
        self._decode = window_decoder(tokenizer)
        # Only the decoding window is kept: `_window[:_read]` is the prefix (already emitted,
        # decoded as `_prefix_text`), `_window[_read:]` the tokens not yet emitted.
        self._window: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._read = len(self._window)
        self._prefix_text = self._decode(self._window)
        self._pieces: list[str] = []  # the stable text, joined on demand (appending is O(1))
        self._pending = ""
        self._num_tokens = 0

    @property
    def text(self) -> str:
        """The stable completion text: never ends inside an unfinished character."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def full_text(self) -> str:
        """The completion text including whatever held-back tokens decode to now."""
        return self.text + self._pending

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def append(self, token_id: int) -> str:
        """Adds a generated token; returns the text that became stable (maybe empty)."""
        self._window.append(token_id)
        self._num_tokens += 1
        decoded = self._decode(self._window)
        if len(decoded) <= len(self._prefix_text) or decoded.endswith(REPLACEMENT_CHAR):
            self._pending = decoded[len(self._prefix_text) :]
            return ""
        new_text = decoded[len(self._prefix_text) :]
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self._prefix_text = self._decode(self._window)
        self._pieces.append(new_text)
        self._pending = ""
        return new_text

    def check_invariants(self) -> None:
        if not 0 <= self._read <= len(self._window):
            raise ValueError(f"read offset {self._read} outside window of {len(self._window)}")
        if self.text.endswith(REPLACEMENT_CHAR):
            raise ValueError("stable text ends in U+FFFD")


class StopStringTracker:
    """One sequence's completion text and the stop strings looked for in it.

    `min_tokens` holds stop strings off as vLLM does: the text of the first `min_tokens`
    tokens is never searched on its own; from the next token on, each token's new text is
    searched, together with the `len(stop) - 1` characters before it, so a stop string that
    starts inside the held-off text and ends in the new text does stop the sequence.
    """

    def __init__(self, tokenizer: TokenDecoder, stops: Sequence[str], min_tokens: int) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, [])
        self.matcher = StopStringMatcher(stops)
        self.min_tokens = min_tokens
        # Only the checked text's last `max_stop_len - 1` characters are kept for the search
        # (a stop string may span them and the new text), so a token costs its new text's
        # length, not the whole text's.
        self._tail = ""
        self._tail_start = 0  # where `_tail` starts in the text
        self.cut: int | None = None

    def append(self, token_id: int) -> bool:
        """Adds a generated token; True when a stop string has appeared (`cut` says where)."""
        new = self.detokenizer.append(token_id)
        if not new:
            return False
        window = self._tail + new
        if self.detokenizer.num_tokens > self.min_tokens:
            found = self.matcher.find(window, len(self._tail))
            if found is not None:
                self.cut = self._tail_start + found
                return True
        keep = min(self.matcher.max_stop_len - 1, len(window))
        self._tail = window[len(window) - keep :]
        self._tail_start += len(window) - keep
        return False

    @property
    def text(self) -> str:
        """The stable text, cut before the stop string once one has appeared."""
        text = self.detokenizer.text
        return text if self.cut is None else text[: self.cut]
