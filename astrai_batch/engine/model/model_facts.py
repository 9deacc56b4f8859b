"""What the engine needs to know of a loaded transformers model (`LoadedModel`): its
shapes, context, end-of-sequence ids and chat template, read off its config and tokenizer.
Shared by the loader and the tensor-parallel launch, which load a model differently."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.model.spec import ModelSpec
from astrai_batch.engine.model.support import has_chat_template
from astrai_batch.errors import ModelLoadError


def loaded_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_spec: ModelSpec,
    max_model_len: int,
) -> LoadedModel:
    config = model.config
    architectures = getattr(config, "architectures", None)
    num_heads = int(config.num_attention_heads)
    num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    head_dim = getattr(config, "head_dim", None)
    latent = latent_attention_dims(config)
    if latent is not None:
        # multi-head latent attention: the pages hold the compressed latent and the roped
        # shared key, one vector per token and layer (`engine.attention.latent_pages`)
        head_dim, num_kv_heads = latent_width(config), 1
    elif head_dim is None:
        if config.hidden_size % num_heads:
            raise ModelLoadError(
                f"Model {model_spec.name!r}: hidden_size {config.hidden_size} is not divisible "
                f"by num_attention_heads {num_heads} and the config gives no head_dim"
            )
        head_dim = config.hidden_size // num_heads
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=model_spec.name,
        source=model_spec.location,
        architecture=str(architectures[0]) if architectures else type(model).__name__,
        max_model_len=max_model_len,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        num_layers=int(config.num_hidden_layers),
        num_kv_heads=num_kv_heads,
        head_dim=int(head_dim),
        has_chat_template=has_chat_template(tokenizer),
        kv_latent=latent is not None,
    )


def latent_attention_dims(config) -> tuple[int, int] | None:
    """(key head dim, value head dim) of a multi-head latent attention model (DeepSeek V2/V3,
    Kimi K2: a `kv_lora_rank`), else None."""
    if getattr(config, "kv_lora_rank", None) is None:
        return None
    key = int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
    return key, int(config.v_head_dim)


def latent_width(config) -> int:
    """What a latent page holds per token and layer: kv_lora_rank + qk_rope_head_dim."""
    return int(config.kv_lora_rank) + int(config.qk_rope_head_dim)


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    generation_config = getattr(model, "generation_config", None)
    source = generation_config if generation_config is not None else model.config
    declared = getattr(source, "eos_token_id", None)
    if declared is None:
        ids: set[int] = set()
    elif isinstance(declared, int):
        ids = {declared}
    else:
        ids = {int(token_id) for token_id in declared}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
