"""KV memory per token of multi-head latent attention models: the engine's latent pages
against the full (expanded) per-head layout.

Run: .venv/bin/python scripts/mla_memory.py

For each published config's attention shapes (bfloat16, page size 16), the engine's pool is
built as `engine_setup` builds it (`KVPool(latent=True)`, one `kv_lora_rank +
qk_rope_head_dim` vector per token and layer, shapes from `model_facts`) with 64 pages, and
its tensors' bytes (`KVPool.memory_bytes`, what is allocated) are divided by its token slots.
The full layout is the pool the engine held before latent pages: every head's key (no-rope +
rope dims) and its value zero-padded to the key's width, sized by `KVPool.bytes_per_page`
(not allocated: DeepSeek V3's would be 366 MiB for 64 pages). No weights are built.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.model.model_facts import latent_attention_dims, latent_width

MLA = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
MODELS = {
    "DeepSeek-V3 / R1": ("deepseek_v3", 61, 128),
    "Kimi K2": ("deepseek_v3", 61, 64),
    "DeepSeek-V2-Lite": ("deepseek_v2", 27, 16),
}
PAGE = 16
PAGES = 64


def main() -> None:
    print("| model | layers | heads | latent pages (measured) | full layout | full / latent |")
    print("|---|---|---|---|---|---|")
    for name, (model_type, layers, heads) in MODELS.items():
        config = AutoConfig.for_model(
            model_type, num_hidden_layers=layers, num_attention_heads=heads, **MLA
        )
        pool = KVPool(
            num_layers=layers,
            num_kv_heads=1,
            head_dim=latent_width(config),
            page_size=PAGE,
            num_pages=PAGES,
            dtype=torch.bfloat16,
            device="cpu",
            latent=True,
        )
        latent = pool.memory_bytes / pool.num_slots
        key, _ = latent_attention_dims(config)
        full = (
            KVPool.bytes_per_page(
                num_layers=layers,
                num_kv_heads=heads,
                head_dim=key,
                page_size=PAGE,
                dtype=torch.bfloat16,
            )
            / PAGE
        )
        print(
            f"| {name} | {layers} | {heads} | {latent / 1024:,.1f} KiB | {full / 1024:,.0f} KiB "
            f"| {full / latent:.0f}x |"
        )


if __name__ == "__main__":
    main()
