"""Planning: tokenizing windows of rows, ordering them for prefix reuse, sharding over workers,
and predicting reuse without a model (`astrai-batch plan`).

Imports `io`, `options` and the tokenizer; no engine forward and no output files.
"""
