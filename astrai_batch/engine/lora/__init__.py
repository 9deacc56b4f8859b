"""Per-row LoRA adapters: PEFT adapter directories read with safetensors (no PEFT needed),
checked against the base model, and applied to a mixed batch by wrapped linear layers."""
