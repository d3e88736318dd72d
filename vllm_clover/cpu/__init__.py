"""CPU kernels and the per-instruction-set choices of how the engine multiplies."""
