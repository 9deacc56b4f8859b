"""Shared fixtures: tiny randomly initialised models and an offline tokenizer.

Everything here is built locally (no hub): a byte-level BPE tokenizer trained with the
`tokenizers` library on a small inline corpus, and Llama / Qwen2 models with a few layers,
saved as ordinary Hugging Face model directories so the real loading code reads them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# CUDA's Triton kernels (invariant numerics) run in Triton's interpreter on the test machine's
# CPU; set before any test imports a kernel, as `triton.jit` reads it when it decorates
os.environ.setdefault("TRITON_INTERPRET", "1")
# `--dtype auto` on the CPU reads the CPU's bf16 flags: pinned to none, so every test (and
# every CLI subprocess it starts) runs float32 on any CI CPU; tests of the choice inject flags
os.environ.setdefault("ASTRAI_BATCH_CPU_FLAGS", "")

CORPUS = [
    "You are a helpful assistant. Answer the question briefly and precisely.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Summarise the following article about batch inference and prefix caching.",
    "What is the capital of France? Paris is the capital and largest city.",
    "Write a haiku about autumn leaves falling on a quiet pond at dusk.",
    "Translate to German: the weather is nice today and we go for a walk.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Parquet files store columns in row groups; each row group holds column chunks.",
    "Large language models generate text one token at a time using a KV cache.",
    "0123456789 !?.,;:'\"()[]{}<>+-*/=_ abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer():
    """A byte-level BPE tokenizer (vocab 384) as a fast HF tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config_kwargs(tokenizer) -> dict:
    """The shape every tiny test model shares: 2 layers, hidden size 64, GQA 4:2 heads."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        # A wide init makes greedy continuations varied (not a two-token loop) and their
        # top-1 margins large next to float noise, so exact comparisons test the engine.
        initializer_range=0.3,
    )


def _save_tiny_model(path: Path, model_type: str) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tokenizer = build_tiny_tokenizer()
    common = tiny_config_kwargs(tokenizer)
    if model_type == "llama":
        config = LlamaConfig(**common)
    else:
        config = Qwen2Config(**common, use_sliding_window=False)
    torch.manual_seed(1234 if model_type == "llama" else 4321)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model_dir(request, tiny_llama_dir, tiny_qwen2_dir) -> Path:
    return tiny_llama_dir if request.param == "llama" else tiny_qwen2_dir


class S3Bucket:
    """A bucket on the local S3 server: pyarrow's own S3 filesystem for it (`fs`), and URIs
    that carry the endpoint and credentials (`uri(key)`), as a user would pass them."""

    def __init__(self, fs, query: str) -> None:
        self.fs = fs
        self.query = query

    def uri(self, key: str) -> str:
        return f"s3://test:test@bucket/{key}?{self.query}"

    def names(self, directory: str) -> list[str]:
        """Every object under `directory` (a key prefix without the bucket), sorted."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(f"bucket/{directory}", allow_not_found=True, recursive=True)
        return sorted(info.path for info in self.fs.get_file_info(selector))

    def upload(self, local: Path, key: str) -> str:
        """Copy a local file to `key`; returns its URI."""
        with self.fs.open_output_stream(f"bucket/{key}", compression=None) as stream:
            stream.write(local.read_bytes())
        return self.uri(key)


@pytest.fixture(scope="session")
def s3_bucket():
    """An S3 server (moto's) on 127.0.0.1 for the session, with one empty bucket."""
    pytest.importorskip("moto.server")
    from s3_server import s3_server

    with s3_server() as (fs, query):
        yield S3Bucket(fs, query)


def pytest_collection_modifyitems(config, items) -> None:
    """`long` tests (each most of a minute, their promise also soaked by `scripts/soak`) run
    with ASTRAI_LONG_TESTS=1 (`scripts/test-long`), keeping the default suite inside its
    time budget on 2 cores."""
    if os.environ.get("ASTRAI_LONG_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="long test: scripts/test-long runs it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
