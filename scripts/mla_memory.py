"""KV memory per token of multi-head latent attention models: the engine's pages against the
compressed-latent layout.

Run: .venv/bin/python scripts/mla_memory.py

The engine's figure is `KVPool.bytes_per_page` (what the pool allocates: every head's
expanded key, no-rope + rope dims, and its value zero-padded to the key's width) over the
page's tokens, for the published configs' attention shapes, bfloat16; no weights are built.
The latent layout holds one `kv_lora_rank + qk_rope_head_dim` vector per layer and token.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.model.model_facts import latent_attention_dims

MLA = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
MODELS = {
    "DeepSeek-V3 / R1": ("deepseek_v3", 61, 128),
    "Kimi K2": ("deepseek_v3", 61, 64),
    "DeepSeek-V2-Lite": ("deepseek_v2", 27, 16),
}
PAGE = 16


def main() -> None:
    print("| model | layers | heads | engine pages | unpadded K+V | latent | pages / latent |")
    print("|---|---|---|---|---|---|---|")
    for name, (model_type, layers, heads) in MODELS.items():
        config = AutoConfig.for_model(
            model_type, num_hidden_layers=layers, num_attention_heads=heads, **MLA
        )
        key, value = latent_attention_dims(config)
        ours = (
            KVPool.bytes_per_page(
                num_layers=layers,
                num_kv_heads=heads,
                head_dim=key,
                page_size=PAGE,
                dtype=torch.bfloat16,
            )
            / PAGE
        )
        unpadded = layers * heads * (key + value) * 2
        latent = layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 2
        print(
            f"| {name} | {layers} | {heads} | {ours / 1024:,.0f} KiB | {unpadded / 1024:,.0f} "
            f"KiB | {latent / 1024:,.1f} KiB | {ours / latent:.0f}x |"
        )


if __name__ == "__main__":
    main()
