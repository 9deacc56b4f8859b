"""gpt-oss's harmony format, read from generated text decoded with its special tokens.

The prompt ends with ``<|start|>assistant``; the model writes messages such as
``<|channel|>analysis<|message|>...<|end|>`` (reasoning),
``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
{...}<|call|>`` (a tool call) and ``<|channel|>final<|message|>...<|return|>`` (the answer).
A message cut off before its end marker runs to the end of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MESSAGE = re.compile(
    r"(?:<\|start\|>[^<]*)?(?P<header>(?:[^<]|<\|channel\|>|<\|constrain\|>)*?)<\|message\|>"
    r"(?P<text>.*?)(?P<end><\|end\|>|<\|call\|>|<\|return\|>|$)",
    re.DOTALL,
)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


@dataclass(frozen=True)
class HarmonyMessage:
    channel: str | None  # analysis, commentary, final
    recipient: str | None  # functions.NAME for a tool call
    text: str
    complete: bool  # ended by its marker, not cut off


def harmony_messages(text: str) -> list[HarmonyMessage]:
    """The messages of `text`, in order (none when it holds no ``<|message|>``)."""
    out = []
    for match in _MESSAGE.finditer(text):
        start = text.rfind("<|start|>", 0, match.start("header"))
        header = match.group("header")
        if start >= 0 and start >= match.start():
            header = text[start : match.end("header")]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        out.append(
            HarmonyMessage(
                channel=channel.group(1) if channel else None,
                recipient=recipient.group(1) if recipient else None,
                text=match.group("text"),
                complete=bool(match.group("end")),
            )
        )
        if not match.group("end"):
            break
    return out
