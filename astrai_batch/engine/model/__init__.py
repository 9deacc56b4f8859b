"""Models: finding, converting and loading a model and its tokenizer.

Owns the model directory resolution (a Hugging Face directory or a GGUF file converted once to
a cached safetensors copy), the model specification read from its config, and the checks of
what the engine supports (architectures, attention variants, chat templates). Imports torch,
transformers and `astrai_batch.errors`; nothing else of the engine.
"""
