"""astrai-batch: offline batch inference for large language models."""

__version__ = "0.1.0"
