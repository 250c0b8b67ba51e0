"""CPU reference runtime: a tiny deterministic causal LM behind Triton's python backend."""
