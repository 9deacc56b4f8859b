"""Models built from a config with random weights, and a tokenizer trained in code.

For checks that must run where no checkpoint can travel (the GPU machine receives only our
source tree) and for host-overhead measurements, where the weights do not matter. A wide
`initializer_range` makes greedy continuations varied and their top-1 margins large next to
float noise, so token-for-token comparisons test the engine, not rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from astrai_batch.engine.model.loader import LoadedModel, describe_model

CORPUS = (
    "You are a helpful assistant. Answer the question briefly and precisely.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Summarise the following article about batch inference and prefix caching.",
    "What is the capital of France? Paris is the capital and largest city.",
    "Large language models generate text one token at a time using a KV cache.",
    "0123456789 !?.,;:'\"()[]{}<>+-*/=_ abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class ModelShape:
    """The config fields that decide a Llama model's cost."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    initializer_range: float
    model_type: str = "llama"
    overrides: tuple[tuple[str, Any], ...] = ()  # config fields beyond a Llama's


# The test suite's tiny model; SmolLM2-135M's shape; a Llama-3.2-1B-like shape.
TINY = ModelShape("tiny", 384, 64, 128, 2, 4, 2, 1024, 0.3)
SMOLLM2_135M = ModelShape("smollm2-135m-shape", 49152, 576, 1536, 30, 9, 3, 8192, 0.1)
LLAMA_1B = ModelShape("llama-1b-shape", 32000, 2048, 8192, 16, 32, 8, 8192, 0.05)
# the tiny shape as a Gemma 2: every other layer windowed, attention and final softcapping
GEMMA2_WINDOWED = ModelShape(
    "gemma2-windowed-tiny",
    *(384, 64, 128, 2, 4, 2, 1024, 0.3),
    model_type="gemma2",
    overrides=(
        ("head_dim", 16),
        ("query_pre_attn_scalar", 16),
        ("sliding_window", 16),
        ("attn_logit_softcapping", 50.0),
        ("final_logit_softcapping", 30.0),
    ),
)
SHAPES = {shape.name: shape for shape in (TINY, SMOLLM2_135M, LLAMA_1B, GEMMA2_WINDOWED)}


def build_tokenizer(vocab_size: int = TINY.vocab_size):
    """A byte-level BPE tokenizer trained on a small inline corpus (no files, no network).

    Its vocabulary may be smaller than a large model's; ids past it decode to nothing, which
    is all the engine needs from a tokenizer when prompts come as token ids.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, TINY.vocab_size),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS) * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def build_model(
    shape: ModelShape, *, device: str | torch.device = "cpu", dtype=torch.float32, seed: int = 0
) -> LoadedModel:
    """A randomly initialised model of `shape` (a Llama unless it names another type) on
    `device`, ready for the engine."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_tokenizer(shape.vocab_size)
    config = AutoConfig.for_model(
        shape.model_type,
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=shape.initializer_range,
        **dict(shape.overrides),
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return describe_model(model, tokenizer, name=shape.name, source="random weights")
