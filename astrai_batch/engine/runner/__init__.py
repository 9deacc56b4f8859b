"""The model runner: one forward over a packed, ragged step, and what it needs per step.

Owns the step's host buffers (`step_buffers`), the forward through the model with paged
attention, batch-invariant linear layers, CUDA-graph decode (buckets and capture), the forward
timer, and the memory budget that sizes the KV pool. Imports `attention`, `cache.kv_pool` and
torch; knows nothing of scheduling policy or sampling.
"""
