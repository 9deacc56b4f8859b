"""Multi-head latent attention over pages that hold the compressed latent.

DeepSeek V2/V3 (and Kimi K2) project each token to a latent (`kv_lora_rank` wide, normalized
by `kv_a_layernorm`) and one rope key shared by every head (`qk_rope_head_dim`); each head's
key and value come from the latent through `kv_b_proj`. The pool keeps only those two, side by
side: one `kv_lora_rank + qk_rope_head_dim` vector per token and layer (`KVPool(latent=True)`),
which is what makes MLA's memory saving real (DeepSeek V3: 68.6 KiB a token in bfloat16, not
5,856 KiB for the expanded heads).

transformers' attention module computes the latent and the roped shared key, then calls its
`expand_kv(latent, rope_key)` to make every head's key and value. `LatentPages` takes that call
over for each layer: it writes the step's new latents into the pool, decompresses the latents
of every page the step reads with the layer's own `expand_kv` (its `kv_b_proj`), and lays the
result out as an ordinary paged cache of the step's pages only, numbered 0.. in page order.
The step's plan is made over those step-local page numbers (`localize`), so every attention
path (the CPU flash blocks, the block attention, the step-shaped SDPA) reads it unchanged;
values are zero-padded to the key's width as the paths need one width (`paged_attention`).

Exactness: a token's decompressed key and value must not depend on how many tokens were
decompressed together, which the invariant numerics' row-tiled `kv_b_proj` guarantees (its
rows are computed the same way at any row count); they are then the bits the new tokens' own
expansion gave when they were written. Nothing is absorbed into the query or the output
projection (that would change transformers' rounding). The cost: each layer re-expands the
step's pages every step, a GEMM of (pages x page size) rows by `kv_lora_rank`.

Only one layer's expansion is alive at a time: the next layer's call drops the previous one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from astrai_batch.engine.attention.step_arrays import StepArrays


@dataclass
class ExpandedPages:
    """What the attention plans read as the pool: the step's expanded keys and values per
    layer, [step pages x page size, heads, key width] each, in step-local page order.
    Between layers an entry is a one-page placeholder of the right shape and dtype."""

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    page_size: int
    placeholder: torch.Tensor = field(repr=False)

    def clear(self) -> None:
        for caches in (self.key_cache, self.value_cache):
            for layer in range(len(caches)):
                caches[layer] = self.placeholder


def is_latent_attention(module: torch.nn.Module) -> bool:
    """An attention module of transformers' MLA (DeepSeek V2/V3): it expands a latent."""
    return callable(getattr(module, "expand_kv", None)) and hasattr(module, "kv_b_proj")


class LatentPages:
    """The latent pool's reader and writer for one model runner (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        latent_cache: list[torch.Tensor],
        page_size: int,
        query_heads: int,
    ) -> None:
        config = model.config
        self.rank = int(config.kv_lora_rank)
        self.key_width = int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
        self.value_width = int(config.v_head_dim)
        width = self.rank + int(config.qk_rope_head_dim)
        first = latent_cache[0]
        if first.shape[1:] != (1, width):
            raise ValueError(
                f"latent pages hold [slots, 1, {width}] per layer, got {tuple(first.shape)}"
            )
        self.latent_cache = latent_cache
        self.page_size = page_size
        placeholder = first.new_zeros(page_size, query_heads, self.key_width)
        layers = len(latent_cache)
        self.expanded = ExpandedPages(
            [placeholder] * layers, [placeholder] * layers, page_size, placeholder
        )
        self._pages: torch.Tensor | None = None  # the step's pages, in step-local order
        self._write_slots: torch.Tensor | None = None  # the new tokens' slots in the pool
        self.layers = 0
        for module in model.modules():
            if is_latent_attention(module):
                # a model serves one runner at a time: the latest runner's pages (a runner
                # made before over the same model, e.g. the memory profile's, is unhooked)
                ours = module.__dict__.get("expand_kv")
                original = ours.args[1] if ours is not None else module.expand_kv
                module.expand_kv = partial(self._expand, module, original)
                self.layers += 1

    def localize(self, step: StepArrays) -> tuple[StepArrays, np.ndarray, np.ndarray]:
        """(the step over step-local page numbers, the step's pages, the new tokens' pool
        slots): what `begin` is given once the host arrays are on the device."""
        pages, local_tables = np.unique(step.page_tables, return_inverse=True)
        page = self.page_size
        write_pages = np.searchsorted(pages, step.write_slots // page)
        local = step._replace(
            page_tables=local_tables.reshape(step.page_tables.shape).astype(np.int64),
            write_slots=write_pages * page + step.write_slots % page,
        )
        return local, pages.astype(np.int64), step.write_slots

    def begin(self, pages: torch.Tensor, write_slots: torch.Tensor) -> None:
        self._pages, self._write_slots = pages, write_slots

    def end(self) -> None:
        self._pages = self._write_slots = None
        self.expanded.clear()

    def _expand(self, module, expand_kv, latent: torch.Tensor, rope_key: torch.Tensor):
        """transformers' `expand_kv(latent [1, 1, T, rank], rope_key [1, 1, T, rope])`: the
        new tokens' keys and values, after the layer's pages are written and expanded."""
        if self._pages is None:
            raise RuntimeError(
                "latent attention pages need the engine's step; this model is owned by an "
                "astrai-batch ModelRunner"
            )
        layer = module.layer_idx
        cache = self.latent_cache[layer]
        new = torch.cat((latent[0, 0], rope_key[0, 0]), dim=-1)
        cache.index_copy_(0, self._write_slots, new.unsqueeze(1).to(cache.dtype))
        width = cache.shape[-1]
        by_page = cache.view(-1, self.page_size, width)
        rows = by_page.index_select(0, self._pages).view(1, 1, -1, width).to(latent.dtype)
        keys, values = expand_kv(rows[..., : self.rank], rows[..., self.rank :])
        self.expanded.clear()  # the previous layer's expansion is done with
        # [1, heads, N, width] -> [N, heads, width], values zero-padded to the keys' width
        self.expanded.key_cache[layer] = keys[0].transpose(0, 1).contiguous()
        padded = F.pad(values[0], (0, self.key_width - self.value_width))
        self.expanded.value_cache[layer] = padded.transpose(0, 1).contiguous()
        return expand_kv(latent, rope_key)
