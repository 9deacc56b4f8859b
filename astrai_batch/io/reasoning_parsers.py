"""Reasoning split from the answer in a model's text (``--reasoning-parser``):

- ``deepseek_r1``: DeepSeek-R1 reasons first, always (its template opens ``<think>`` in the
  prompt): the text up to ``</think>`` is reasoning, the rest the answer; no ``</think>``:
  all reasoning, cut off inside it;
- ``qwen3``: Qwen3's ``<think>...</think>`` when the model opens it (a leading ``<think>``,
  or a ``</think>`` when the template opened it); text without either is all answer
  (``enable_thinking: false``);
- ``harmony``: gpt-oss's ``analysis`` channel is reasoning, its ``final`` channel the answer
  (read with special tokens kept: `NEEDS_SPECIAL_TOKENS`).

A parser gives (reasoning, content); either may be None (absent). A text cut off inside its
reasoning has reasoning and no content.
"""

from __future__ import annotations

from astrai_batch.io.harmony import harmony_messages

REASONING_PARSERS = ("deepseek_r1", "qwen3", "harmony")
NEEDS_SPECIAL_TOKENS = frozenset({"harmony"})


def split_reasoning(parser: str, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of `text` by `parser` (one of REASONING_PARSERS)."""
    if parser == "harmony":
        return _harmony(text)
    opened = text.lstrip().startswith("<think>")
    body = text.lstrip().removeprefix("<think>") if opened else text
    reasoning, closed, answer = body.partition("</think>")
    if not closed:
        if parser == "deepseek_r1" or opened:
            return _text(reasoning), None
        return None, _text(text)
    return _text(reasoning), _text(answer)


def _harmony(text: str) -> tuple[str | None, str | None]:
    messages = harmony_messages(text)
    if not messages:
        return None, _text(text)
    reasoning = "".join(m.text for m in messages if m.channel == "analysis")
    content = "".join(m.text for m in messages if m.channel == "final")
    return _text(reasoning), _text(content)


def _text(value: str) -> str | None:
    return value if value.strip() else None
