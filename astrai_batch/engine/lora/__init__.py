"""Per-row LoRA adapters: PEFT adapter directories read with safetensors (no PEFT needed),
checked against the base model, and applied to a mixed batch by wrapped linear layers.

Imports torch and `model`; the runner reads the bank (`bank.find_bank`) to group each step's
rows by adapter.
"""
