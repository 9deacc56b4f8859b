"""The requests that never decode: scoring and embedding, and the core's bookkeeping of them."""
