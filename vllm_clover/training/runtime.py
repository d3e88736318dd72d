"""Process-level plumbing: devices, torch.distributed (DDP under torchrun), seeds, memory.

The same ``vllm-clover train`` runs alone or under ``torchrun --nproc_per_node N``; torchrun
sets RANK / WORLD_SIZE / LOCAL_RANK and we join a process group (NCCL on CUDA, gloo on CPU).
"""

from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from vllm_clover.cpu.malloc import keep_large_blocks, trim_heap
from vllm_clover.training.config import TrainingError


@dataclass(frozen=True)
class Runtime:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over processes (identity when alone). float64 goes through as is."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor


def resolve_device(arg: str, local_rank: int = 0) -> torch.device:
    """'auto' -> cuda:<local rank> when a GPU is there, else cpu; 'cuda' -> cuda:<local rank>."""
    if arg == "auto":
        arg = "cuda" if torch.cuda.is_available() else "cpu"
    if arg == "cuda":
        arg = f"cuda:{local_rank}"
    device = torch.device(arg)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TrainingError(f"--device {arg}: no CUDA device is available")
    return device


def init_runtime(device_arg: str) -> Runtime:
    """Join torchrun's process group if launched by it; otherwise a single process. On CPU,
    freed large blocks stay in the heap (`vllm_clover.cpu.malloc`; docs/training.md)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_arg, local)
    if device.type == "cpu":
        keep_large_blocks()
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Runtime(rank, world, device)


def shutdown_runtime(runtime: Runtime) -> None:
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict[str, object]:
    state: dict[str, object] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, object]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------- memory
def reset_peak_memory(device: torch.device) -> None:
    """Start a peak-memory window (CUDA allocator, or the process RSS high-water mark)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    clear_refs = Path(f"/proc/{os.getpid()}/clear_refs")
    if clear_refs.exists():
        try:
            clear_refs.write_text("5")  # Linux: reset VmHWM to the current RSS
        except OSError:
            pass  # not permitted here: the peak then covers the whole process


def current_memory_bytes(device: torch.device) -> int | None:
    """Now: CUDA allocated bytes, or the process RSS (Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _proc_status_bytes("VmRSS:")


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak since ``reset_peak_memory``: CUDA allocated bytes, or the process peak RSS (Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _proc_status_bytes("VmHWM:")


HEAP_TRIM_EVERY = 100  # steps between two trims of a CPU trainer's heap


def trim_heap_after(step: int, device: torch.device) -> None:
    """On CPU, every HEAP_TRIM_EVERY steps, hand back the pages of the heap's free holes,
    which tensors whose sizes change from step to step leave (``vllm_clover.cpu.malloc``)."""
    if device.type == "cpu" and step % HEAP_TRIM_EVERY == 0:
        trim_heap()


def return_freed_memory() -> None:
    """Collect, then hand the freed heap back to the system where the C library can (glibc's
    ``malloc_trim``; elsewhere a no-op), e.g. after a cache fill, so the page cache keeps
    room for the shards training reads."""
    gc.collect()
    trim_heap()


def _proc_status_bytes(field: str) -> int | None:
    status = Path(f"/proc/{os.getpid()}/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024  # kB
    return None


def describe_hardware(device: torch.device) -> str:
    """A short description for model cards, e.g. "cpu: x86_64, 2 threads" or "cuda: NVIDIA H100"."""
    import platform

    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {platform.machine()}, {torch.get_num_threads()} threads"
