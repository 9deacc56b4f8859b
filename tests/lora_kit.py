"""LoRA adapters made with PEFT for the tests, and PEFT's greedy output as the reference."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    rank: int,
    seed: int,
    targets: list[str] = ALL_LINEAR,
    scale: float = 0.15,
    **config,
) -> Path:
    """A PEFT LoRA adapter of `model_dir` with random non-zero A and B (PEFT starts B at
    zero, which would make the adapter the base model), saved with `save_pretrained`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, **config)
    model = get_peft_model(base, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(out_dir)
    return out_dir


@cache
def _peft_model(model_dir: str, adapter_dir: str | None):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is None:
        return base.eval()
    from peft import PeftModel

    return PeftModel.from_pretrained(base, adapter_dir).eval()


def peft_greedy(
    model_dir: Path, adapter_dir: Path | None, prompts, max_new_tokens: int
) -> list[list[int]]:
    """transformers + PEFT `generate` (the adapter active), one prompt at a time, greedy."""
    model = _peft_model(str(model_dir), None if adapter_dir is None else str(adapter_dir))
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs
