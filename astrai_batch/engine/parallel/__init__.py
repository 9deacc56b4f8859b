"""Tensor parallelism: one scheduler on rank 0, the model's layers split over N ranks.

`launch` starts the ranks (one process each) and loads rank 0's shard; `worker` is the other
ranks' loop; `rank_group` holds the process group, the reductions and failure diagnosis;
`step_channel` carries each step's arrays from rank 0; `sharded_load` builds a rank's shard
from the checkpoint's slices; `shard_plan` decides what is split and refuses what cannot be.
"""
