"""eagle3/memory.py tune_cpu_malloc: a tensor under 32 MiB freed and allocated again (the fused loss's fp32 [Vd, H]
lm_head gradient, once per TTT step) comes from the heap, where glibc's default maps it afresh.

Each case runs in a fresh single-threaded interpreter: mallopt cannot be undone, and glibc's dynamic threshold
depends on what the process freed before. The oracle is glibc's own count of mmapped bytes (mallinfo2). Page faults
are counted too, but only the first allocation's are stable enough to assert: whether a later one reuses freed
heap pages depends on the small blocks allocated in between. The whole train step's gain is measured, not
tested: bench/train_bench.py --malloc default,tuned."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIB = 24  # over glibc's initial mmap threshold (128 KiB), under CPU_MALLOC's 32 MiB
PAGES = (MIB << 20) // 4096

PROBE = f"""
import ctypes, json, resource, sys
sys.path.insert(0, {str(ROOT)!r})
import torch
from eagle3.memory import tune_cpu_malloc

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = Mallinfo2
tuned = tune_cpu_malloc() if sys.argv[1] == "tuned" else None
faults, mapped = [], []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty({MIB} << 18)  # {MIB} MiB of fp32
    mapped.append(mallinfo2().hblkhd)
    t.fill_(1.0)  # touch every page
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del t
print(json.dumps({{"tuned": tuned, "faults": faults, "mapped": mapped}}))
"""

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's")


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tuned_malloc_serves_blocks_under_32_mib_from_the_heap():
    tuned, default = _probe("tuned"), _probe("default")
    assert tuned["tuned"] is True
    # Default: the first 24 MiB tensor is a fresh mapping (mapped also counts ~4 MiB of torch's own blocks).
    assert default["mapped"][0] >= MIB << 20, default
    assert default["faults"][0] > PAGES // 2, default
    # Tuned: no 24 MiB tensor is ever mapped; the heap serves it (and keeps it for the next one).
    assert max(tuned["mapped"]) < MIB << 20, tuned
    assert tuned["faults"][0] > PAGES // 2, tuned
