"""CPU kernels and the per-instruction-set choices of how the engine multiplies; how a CPU
process keeps the large buffers it frees (``malloc``)."""
