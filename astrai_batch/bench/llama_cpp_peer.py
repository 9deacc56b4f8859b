"""The `llama-cpp` peer: llama.cpp (llama-cpp-python's low-level API) on the model's own GGUF.

Our engine loads a GGUF by dequantizing its weights (`engine/model/gguf`); llama.cpp runs the
same file as it is (SmolLM2's packaged file is Q4_1: 4-bit weights, dot products against
8-bit quantized activations), so the two systems hold the same weights and differ in how they
compute with them. Configuration, the best we found for a shared-prefix batch on a CPU:

* one context, `kv_unified` (one KV buffer for all sequences) with `n_seq_max` = the wave's
  prompts, sized to the wave's prefix tree plus its generated tokens (`n_ctx`);
* the prompts of a wave (up to `LLAMA_CPP_WAVE` = 64 at once, as our engine's batch) as one
  prefix tree: each shared cell decoded once with every sharing sequence's id
  (`llama_cpp_plan`), in `llama_decode` calls of `PREFILL_CHUNK` tokens;
* then one `llama_decode` per step with one token per sequence, greedy by argmax over the
  step's logits (the first maximum, as torch's argmax), end of sequence ignored;
* `n_threads` and `n_threads_batch` = torch's thread count, so both sides use the same cores;
  flash attention and the f16 KV cache at llama.cpp's defaults (auto, f16).

llama-cpp-python is the optional extra `llama-cpp`; it builds llama.cpp from source (about 10
minutes on 2 cores), so it is never installed in CI.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_batch.bench.config import LLAMA_CPP
from astrai_batch.bench.llama_cpp_plan import PlannedToken, prefill_plan, prefix_tree_tokens
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.rss import PeakRss
from astrai_batch.bench.runs import SystemRun, check_generated, compact_json
from astrai_batch.errors import AstraiBatchError, ConfigError

LLAMA_CPP_WAVE = 64
PREFILL_CHUNK = 512
CONTEXT_ROUNDING = 256
EXTRA_HINT = "pip install 'astrai-batch[llama-cpp]'"


def require_llama_cpp() -> None:
    """One line naming the extra when llama-cpp-python is missing; checked before loading."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(
            f"peers: {LLAMA_CPP} needs llama-cpp-python, the extra 'llama-cpp': {EXTRA_HINT}"
        )


def gguf_path(model: str) -> Path:
    """The GGUF file the bench model names (a packaged alias or a .gguf path), or a one-line
    refusal: llama.cpp runs GGUF files only."""
    from astrai_batch.engine.model.gguf import find_packaged_alias, locate_packaged_gguf

    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve()
    packaged = find_packaged_alias(model)
    if packaged is not None:
        return locate_packaged_gguf(packaged)
    raise ConfigError(
        f"peers: {LLAMA_CPP} runs a GGUF file; --model {model} is not one (give a .gguf "
        "path or a packaged alias such as smollm2-135m)"
    )


def check_llama_cpp_peer(model: str, device: str) -> Path:
    """Everything the peer needs, before any model loads; returns the GGUF it will run."""
    from astrai_batch.engine.device_choice import device_kind

    if device_kind(device) != "cpu":
        raise ConfigError(f"peers: {LLAMA_CPP} runs on the CPU; got --device {device}")
    require_llama_cpp()
    return gguf_path(model)


@dataclass(frozen=True)
class WavePlan:
    """How many prompts share one context, and the context's cells for the largest wave."""

    wave: int
    n_ctx: int


def wave_plan(prompts: Sequence[Sequence[int]], max_tokens: int, wave: int) -> WavePlan:
    """Cells: the largest wave's prefix tree plus its generated tokens, rounded up."""
    if wave < 1:
        raise ValueError(f"wave must be at least 1, got {wave}")
    size = min(wave, len(prompts))
    cells = max(
        prefix_tree_tokens(prompts[start : start + size])
        + len(prompts[start : start + size]) * max_tokens
        for start in range(0, len(prompts), size)
    )
    return WavePlan(size, -(-cells // CONTEXT_ROUNDING) * CONTEXT_ROUNDING)


class LlamaCppPeer:
    """One loaded GGUF and one context, reused by every run of the bench; `close()` frees."""

    def __init__(self, path: Path, prompts: BenchPrompts, threads: int) -> None:
        import llama_cpp

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load log
        self._lib = llama_cpp
        self.path = path
        self.threads = threads
        self.plan = wave_plan(prompts.prompt_token_ids, prompts.max_tokens, LLAMA_CPP_WAVE)
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        # No extra weight buffers: on an AMX CPU they put Q4_1 weights in llama.cpp's AMX
        # buffer, whose matmul crashes (0.3.36, segfault in ggml_backend_amx_mul_mat on the
        # first decode); Q4_1 has no other repacked layout, so nothing else is lost.
        model_params.use_extra_bufts = False
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise AstraiBatchError(f"{LLAMA_CPP}: llama.cpp could not load {path}")
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.plan.n_ctx
        params.n_batch = PREFILL_CHUNK
        params.n_ubatch = PREFILL_CHUNK
        params.n_seq_max = self.plan.wave
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = True
        params.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise AstraiBatchError(f"{LLAMA_CPP}: llama.cpp could not create a context")
        self._batch = llama_cpp.llama_batch_init(
            max(PREFILL_CHUNK, self.plan.wave), 0, self.plan.wave
        )

    def config(self) -> dict[str, Any]:
        return {
            "gguf": self.path.name,
            "kv_unified": True,
            "n_ctx": self.plan.n_ctx,
            "n_seq_max": self.plan.wave,
            "n_batch": PREFILL_CHUNK,
            "threads": self.threads,
            "prefix_sharing": "multi-sequence cells",
            "llama_cpp_python": self._lib.__version__,
        }

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        """Greedy tokens, `max_tokens` per prompt, end of sequence ignored, in input order."""
        outputs: list[list[int]] = []
        wave = self.plan.wave
        for start in range(0, len(prompts), wave):
            outputs += self._wave(prompts[start : start + wave], max_tokens)
        return outputs

    def _wave(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        lib = self._lib
        lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        last: list[int] = [0] * len(prompts)
        for chunk in prefill_plan(prompts, PREFILL_CHUNK):
            ends = self._decode(chunk)
            for prompt_ids, token in zip(ends, self._argmax(len(ends)), strict=True):
                for index in prompt_ids:
                    last[index] = token
        outputs = [[token] for token in last]
        for step in range(1, max_tokens):
            self._decode(
                [
                    PlannedToken(outputs[i][-1], len(prompts[i]) + step - 1, (i,), (i,))
                    for i in range(len(prompts))
                ]
            )
            for index, token in enumerate(self._argmax(len(prompts))):
                outputs[index].append(token)
        return outputs

    def _decode(self, tokens: Sequence[PlannedToken]) -> list[tuple[int, ...]]:
        """One `llama_decode`; returns, per logits row in order, the prompts it ends."""
        batch = self._batch
        batch.n_tokens = len(tokens)
        outputs = []
        for i, planned in enumerate(tokens):
            batch.token[i] = planned.token
            batch.pos[i] = planned.position
            batch.n_seq_id[i] = len(planned.seq_ids)
            for j, seq_id in enumerate(planned.seq_ids):
                batch.seq_id[i][j] = seq_id
            batch.logits[i] = 1 if planned.ends else 0
            if planned.ends:
                outputs.append(planned.ends)
        status = self._lib.llama_decode(self._ctx, batch)
        if status != 0:
            raise AstraiBatchError(f"{LLAMA_CPP}: llama_decode returned {status}")
        return outputs

    def _argmax(self, rows: int) -> list[int]:
        import numpy as np

        if rows == 0:
            return []
        pointer = self._lib.llama_get_logits(self._ctx)
        logits = np.ctypeslib.as_array(
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(rows, self.n_vocab)
        )
        return logits.argmax(axis=1).tolist()

    def close(self) -> None:
        lib = self._lib
        if self._ctx:
            lib.llama_batch_free(self._batch)
            lib.llama_free(self._ctx)
            lib.llama_model_free(self._model)
            self._ctx = None


def run_llama_cpp(peer: LlamaCppPeer, prompts: BenchPrompts, repeat: int | None) -> SystemRun:
    """One timed run over the prompt set, with its greedy tokens for the agreement figure."""
    ids = [list(prompt) for prompt in prompts.prompt_token_ids]
    with PeakRss() as rss:
        started = time.perf_counter()
        outputs = peer.generate(ids, prompts.max_tokens)
        wall = time.perf_counter() - started
    lengths = [len(output) for output in outputs]
    return SystemRun(
        system=LLAMA_CPP,
        repeat=repeat,
        wall_seconds=wall,
        prompt_tokens=prompts.prompt_tokens,
        generated_tokens=check_generated(LLAMA_CPP, lengths, prompts.max_tokens),
        peak_rss_bytes=rss.peak_bytes,
        system_config=compact_json(peer.config()),
        token_ids=tuple(tuple(output) for output in outputs),
    )
