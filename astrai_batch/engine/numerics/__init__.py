"""The checks behind invariant numerics: the BLAS row-scheme probe and the start-up probe."""
