"""Does backing the target's weights with 2 MB pages speed a decode-sized forward?
All 2-D weights of the reference target packed into one flat bfloat16 buffer per copy;
copy A madvised MADV_HUGEPAGE then MADV_COLLAPSE, copy B MADV_NOHUGEPAGE; the linears of
the whole model (M rows each, the LM head included) timed on A and B alternately. (Here the
collapse of the still empty region fails with EINVAL, printed; A's pages come in as 2 MiB
pages when the weights are copied, as the AnonHugePages line shows.)
usage: python thp.py MODEL.safetensors [M ...]"""

import ctypes
import mmap
import re
import sys
import time
from statistics import median

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25
HUGE = 2 << 20


def anon_huge_kb() -> int:
    text = open("/proc/self/smaps_rollup").read()
    return int(re.search(r"AnonHugePages:\s+(\d+)", text).group(1))


def packed(weights, advice):
    total = sum(w.numel() for w in weights) * 2 + 2 * HUGE
    region = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    start = (-address) % HUGE
    size = total - start - HUGE
    for adv in advice:
        if libc.madvise(address + start, size, adv) != 0:
            print("madvise", adv, "errno", ctypes.get_errno())
    flat = torch.frombuffer(region, dtype=torch.bfloat16, count=size // 2, offset=start)
    views, at = [], 0
    for w in weights:
        view = flat[at : at + w.numel()].view(w.shape)
        view.copy_(w)
        views.append(view)
        at += w.numel()
    return region, views


def forward(views, rows):
    for w in views:
        F.linear(rows[w.shape[1]], w)


def main() -> None:
    torch.set_num_threads(1)
    state = load_file(sys.argv[1])
    weights = [t.to(torch.bfloat16) for name, t in sorted(state.items()) if t.dim() == 2]
    sizes = [int(m) for m in sys.argv[2:]] or [1, 4, 8]
    print(f"{len(weights)} weights, {sum(w.numel() for w in weights) * 2 / 2**20:.0f} MiB")
    before = anon_huge_kb()
    ra, a = packed(weights, [MADV_HUGEPAGE, MADV_COLLAPSE])
    mid = anon_huge_kb()
    rb, b = packed(weights, [MADV_NOHUGEPAGE])
    print(f"AnonHugePages: {before} kB -> {mid} kB after A -> {anon_huge_kb()} kB after B")
    for m in sizes:
        rows = {k: torch.randn(m, k, dtype=torch.bfloat16) for k in {w.shape[1] for w in weights}}
        times = {"huge": [], "4k": []}
        for _ in range(3):
            forward(a, rows), forward(b, rows)
        for i in range(15):
            for name, views in (("huge", a), ("4k", b)) if i % 2 else (("4k", b), ("huge", a)):
                t = time.perf_counter()
                for _ in range(3):
                    forward(views, rows)
                times[name].append((time.perf_counter() - t) / 3 * 1e3)
        ratio = [x / y for x, y in zip(times["4k"], times["huge"], strict=True)]
        spans = {k: f"{median(v):.2f} ms ({min(v):.2f}-{max(v):.2f})" for k, v in times.items()}
        print(
            f"M={m}: 4k {spans['4k']}, huge {spans['huge']}, "
            f"4k/huge median {median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})"
        )


if __name__ == "__main__":
    main()
