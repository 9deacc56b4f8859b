"""Vision-language models: the vision tower beside the paged language model, images as
prompt inputs keyed by their content, and the encoder's per-image cache."""
