"""Where vLLM's stop-string rule with min_tokens stops a completion, worked out from whole-prefix
decodes and a list of every occurrence (not from the engine's incremental matcher)."""

from __future__ import annotations


def prefix_texts(tokenizer, ids) -> list[str]:
    """texts[k]: the first k tokens decoded whole (not incrementally)."""
    return [
        tokenizer.decode(
            list(ids[:k]), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        for k in range(len(ids) + 1)
    ]


def vllm_stop(texts: list[str], stop: str, min_tokens: int) -> tuple[int, str] | None:
    """(tokens generated, text) where vLLM's rule stops, by listing every occurrence of `stop`.

    vLLM searches token k's new text (and the len(stop) - 1 characters before it) only for
    k > min_tokens: the stop is the earliest occurrence that ends inside the text token k added.
    """
    for k in range(min_tokens + 1, len(texts)):
        text, before = texts[k], len(texts[k - 1])
        starts = [i for i in range(len(text) - len(stop) + 1) if text.startswith(stop, i)]
        ending_here = [i for i in starts if i + len(stop) > before]
        if ending_here:
            return k, text[: min(ending_here)]
    return None
