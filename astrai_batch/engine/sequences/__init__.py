"""A sequence's bookkeeping: its state, how it ends, a request's samples, step counters."""
