"""Where a stage computes and in which precision: GPU leases, the device resolver, the precision policy.

GPU leases: one flock file per device, so parallel tasks on one host each get their own GPU.

A lease is an exclusive ``flock`` on ``<root>/gpu-<id>.lock``. The kernel drops
a flock when its process dies (even by SIGKILL), so a crashed task cannot leak
a device: there is no stale-lock cleanup to get wrong. Airflow's pool ``gpu``
caps how many tasks run; the lease decides WHICH device each one gets.

    with lease_device(1) as ids:   # e.g. [1]; "cpu" when there is no GPU
        ...                        # CUDA_VISIBLE_DEVICES now names only the leased GPU(s)

The precision policy (``resolve_precision``, below the leases) is decided once per stage from what
the machine has: bf16 where a matrix engine computes it (CUDA sm80+; CPUs with AMX-BF16 or
AVX512-BF16, confirmed by a short cached torch.mm probe), fp32 elsewhere (an AVX2-only CPU runs
bf16 matmuls ~100x slower than fp32). ``mm_peak`` is the one torch.mm peak probe, used by the
policy and by the benches.

No torch import at module level: the Airflow worker imports this before forking.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

from eagle3.errors import InputError

log = logging.getLogger(__name__)

LEASE_DIR_ENV = "EAGLE3_LEASE_DIR"
DEVICE_COUNT_ENV = "EAGLE3_DEVICE_COUNT"  # override GPU discovery (tests, odd hosts)


def default_lease_root() -> str:
    return os.environ.get(LEASE_DIR_ENV, "/tmp/eagle3-gpu-leases")


def visible_devices() -> list[str]:
    """Physical ids of the GPUs this process may use (CUDA_VISIBLE_DEVICES order).

    Counted without initializing CUDA in this process (initializing it would fix
    the visible set before the lease can narrow it).
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if os.environ.get(DEVICE_COUNT_ENV):
        return [str(i) for i in range(int(os.environ[DEVICE_COUNT_ENV]))]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
            return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device(name: str, where: str = "device") -> str:
    """Refuse anything but auto, cpu, cuda or cuda:<i>."""
    if name in DEVICE_CHOICES or (isinstance(name, str) and name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise InputError(f"{where}={name!r}: use auto, cpu, cuda or cuda:<i>")


def resolve_device(name: str = "auto") -> str:
    """The device a stage computes on: "auto" is cuda when a GPU is visible, else cpu.

    Decided without initialising CUDA in this process (a lease may still narrow
    CUDA_VISIBLE_DEVICES, which CUDA reads once, at initialisation).
    """
    check_device(name)
    if name != "auto":
        return name
    return "cuda" if visible_devices() else "cpu"


@contextlib.contextmanager
def lease_device(n: int = 1, root: str | None = None, device_count: int | None = None,
                 timeout_s: float | None = None, poll_s: float = 0.5) -> Iterator[list[int] | str]:
    """Hold ``n`` GPUs exclusively for the duration of the block.

    Yields the leased positions in the visible device list (use ``cuda:<i>`` in a
    process whose CUDA was already initialized; a fresh subprocess sees only the
    leased GPUs, as ``cuda:0..n-1``, through CUDA_VISIBLE_DEVICES, which is set for
    the block and restored after). With no GPU (or n == 0) it is a no-op yielding
    ``"cpu"``. ``device_count`` overrides discovery (positions 0..count-1). When
    all devices are held it waits, polling, up to ``timeout_s`` (None: forever).
    """
    physical = [str(i) for i in range(device_count)] if device_count is not None else visible_devices()
    if n == 0 or not physical:
        yield "cpu"
        return
    if n > len(physical):
        raise InputError(f"lease of {n} GPU(s) asked, but only {len(physical)} visible ({','.join(physical)}); "
                         "lower the request or the pool's pool_slots")
    lock_dir = Path(root or default_lease_root())
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    held: list[tuple[int, object]] = []
    waited = False
    while True:
        for pos, dev in enumerate(physical):
            f = open(lock_dir / f"gpu-{dev}.lock", "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            held.append((pos, f))
            if len(held) == n:
                break
        if len(held) == n:
            break
        # Not enough free: give back what we hold (no hold-and-wait deadlock), then retry.
        for _, f in held:
            f.close()
        held = []
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no {n} free GPU(s) among {physical} after {timeout_s} s (locks in {lock_dir})")
        if not waited:
            log.info("all GPUs leased (locks in %s); waiting", lock_dir)
            waited = True
        time.sleep(poll_s)
    positions = [pos for pos, _ in held]
    for pos, f in held:  # who holds what, for people debugging a stuck pool
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(physical[p] for p in positions)
    log.info("leased GPU(s) %s", os.environ["CUDA_VISIBLE_DEVICES"])
    try:
        yield positions
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old
        for _, f in held:
            f.close()  # closing the last descriptor drops the flock


# ------------------------------------------------------------------ precision
PRECISIONS = ("auto", "float32", "bfloat16")
"""The choices of every stage's ``precision`` field (extract, train, regenerate's hf backend, evaluate's
transformers backend): "auto" follows the machine (:func:`resolve_precision`); the others force it."""
PRECISION_SUMMARY = ("auto: bf16 where the machine has a bf16 matrix engine (CUDA sm80+, a CPU with AMX-BF16 or "
                     "AVX512-BF16), fp32 elsewhere (an AVX2-only CPU runs bf16 ~100x slower); or force float32 / "
                     "bfloat16. Stored and exported formats do not change with it.")
"""One line for help texts and the DAG's Params form."""
PRECISION_ENV = "EAGLE3_PRECISION"
"""float32 or bfloat16: what "auto" resolves to, whatever the machine has (tests force either path with it)."""
PROBE_ENV = "EAGLE3_PRECISION_PROBE"
"""0: trust the CPU flags without the measured torch.mm probe."""
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (/proc/cpuinfo, lscpu) of a bf16 matrix engine: AMX tiles, AVX512 bf16 dot products."""
CUDA_BF16_CAPABILITY = (8, 0)
"""bf16 tensor cores from Ampere (sm80) on; older GPUs emulate bf16."""
PROBE_MIN_SPEEDUP = 1.5
"""On a CPU whose flags promise a bf16 unit, bf16 is chosen only if its torch.mm runs this much faster than
fp32 (a torch build without the oneDNN bf16 kernels would otherwise take the ~100x slower path)."""
_PROBE_N = 512  # the policy's probe: ~3 ms in fp32 on 2 cores; well under a second even on the slow path
_PROBE_WINDOWS = 5  # its best of 5 windows (`mm_peak` window_s)
WORKLOADS = ("matmul", "decode")
"""What a stage mostly runs, and so what the CPU probe measures: "matmul" (batched forwards: extraction, training,
batched regeneration) a 512^3 torch.mm; "decode" (the project decoder: one-token steps and (k+1)-token
verifications of one sequence) linear layers of 1 and 4 rows, where a bf16 matrix engine's tiles sit mostly idle
(measured 2026-12-02 on a 2-core AMX machine: a 1-row 576->1536 linear ran 2x slower in bf16 than in fp32)."""
_DECODE_ROWS, _DECODE_WIDTH = (1, 4), 1024


def check_precision(name: str, where: str = "precision") -> str:
    """Refuse anything but auto, float32 or bfloat16."""
    if name in PRECISIONS:
        return name
    raise InputError(f"{where}={name!r}: use {', '.join(PRECISIONS)} (auto: bf16 where the machine has a bf16 "
                     "matrix engine, fp32 elsewhere)")


@dataclasses.dataclass(frozen=True)
class Precision:
    """A stage's compute precision and why; ``to_dict()`` is what its artifacts record."""

    name: str
    """float32 or bfloat16."""
    requested: str
    """The stage config's value (auto, float32 or bfloat16)."""
    reason: str
    """Why: the config, $EAGLE3_PRECISION, the CPU flags and probe, or the CUDA capability."""

    @property
    def bf16(self) -> bool:
        return self.name == "bfloat16"

    @property
    def dtype(self):
        import torch

        return getattr(torch, self.name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags: the first ``flags`` line of /proc/cpuinfo (or of ``cpuinfo``), else lscpu's."""
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "flags":
            return frozenset(value.split())
    if cpuinfo is None and shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        return cpu_flags(out)
    return frozenset()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


def cpu_precision(flags: frozenset[str], probe=None, workload: str = "matmul") -> tuple[str, str]:
    """(precision, reason) on a CPU with ``flags``; ``probe()`` returns {dtype: GFLOP/s} of the ``workload``'s
    probe (None: trust the flags). Pure, so tests can put any machine through it."""
    units = [f for f in BF16_CPU_FLAGS if f in flags]
    if not units:
        return "float32", "CPU has no bf16 matrix engine (no amx_bf16/avx512_bf16 flag)"
    if probe is None:
        return "bfloat16", f"CPU flags {', '.join(units)}"
    peaks = probe()
    speedup = peaks["bfloat16"] / max(peaks["float32"], 1e-9)
    what = "torch.mm" if workload == "matmul" else f"decode-shaped linear ({'/'.join(map(str, _DECODE_ROWS))} rows)"
    figures = f"{what} bf16 {peaks['bfloat16']:.0f} vs fp32 {peaks['float32']:.0f} GFLOP/s"
    if speedup >= PROBE_MIN_SPEEDUP:
        return "bfloat16", f"CPU flags {', '.join(units)}; {figures}"
    return "float32", (f"CPU flags {', '.join(units)} but {figures} (bf16 must be >= {PROBE_MIN_SPEEDUP}x "
                       "faster)")


def decode_rate(dtype: str, rows=_DECODE_ROWS, width: int = _DECODE_WIDTH, min_s: float = 0.05) -> float:
    """GFLOP/s by CPU time of [r, width] x [width, width] linears, r over ``rows``, in ``dtype`` (the time of
    each row count weighted equally: one-token steps and verifications alternate in a decode)."""
    import torch

    dt = getattr(torch, dtype)
    w = torch.randn(width, width).to(dt)
    flops = seconds = 0.0
    for r in rows:
        x = torch.randn(r, width).to(dt)
        torch.nn.functional.linear(x, w)  # first call: oneDNN's kernel set-up
        n, c0 = 0, time.process_time()
        while time.process_time() - c0 < min_s:
            torch.nn.functional.linear(x, w)
            n += 1
        per_call = (time.process_time() - c0) / n
        flops, seconds = flops + 2 * r * width * width, seconds + per_call
    return flops / max(seconds, 1e-12) / 1e9


def _cached_cpu_probe(workload: str = "matmul") -> dict[str, float]:
    """{float32, bfloat16: GFLOP/s} of the workload's probe (a 512^3 torch.mm, or `decode_rate`), measured
    once per machine, torch, thread count and workload (cached in the eagle3 cache dir)."""
    import torch

    from eagle3.storage import cache_dir

    key = f"{_cpu_model()}|{torch.__version__}|{torch.get_num_threads()} threads|windowed"  # (not the 1-ms probe's)
    if workload != "matmul":
        key += f"|{workload}"
    path = cache_dir() / "precision-probe.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        rate = ((lambda d: mm_peak(d, max_n=_PROBE_N, repeats=_PROBE_WINDOWS).gflops_cpu)
                if workload == "matmul" else decode_rate)
        cache[key] = {d: round(rate(d), 1) for d in ("float32", "bfloat16")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # read-only cache: measure again next time
    return cache[key]


def probing() -> bool:
    """Whether the CPU probes may run ($EAGLE3_PRECISION_PROBE=0 turns them off: the flags decide alone)."""
    return os.environ.get(PROBE_ENV, "1").strip() != "0"


def cpu_probe(workload: str = "matmul") -> dict[str, float] | None:
    """{float32, bfloat16: GFLOP/s per CPU-second} of the policy's cached probe of ``workload``, or None when
    probing is off (`probing`)."""
    return _cached_cpu_probe(workload) if probing() else None


def resolve_precision(requested: str = "auto", device: str = "cpu", workload: str = "matmul") -> Precision:
    """The compute precision of a stage running on ``device`` (a resolved device: cpu, cuda or cuda:<i>).

    An explicit float32/bfloat16 wins; "auto" is $EAGLE3_PRECISION when set, else bf16 on CUDA sm80+ and on
    CPUs with a bf16 matrix engine (flags, then the cached probe of ``workload`` (`WORKLOADS`) unless
    $EAGLE3_PRECISION_PROBE=0), else fp32.
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r} is not one of {', '.join(WORKLOADS)}")
    check_precision(requested)
    if requested != "auto":
        return Precision(requested, requested, "set in the stage config")
    forced = os.environ.get(PRECISION_ENV, "").strip()
    if forced and forced != "auto":
        check_precision(forced, f"${PRECISION_ENV}")
        return Precision(forced, requested, f"${PRECISION_ENV}={forced}")
    if str(device).startswith("cuda"):
        import torch

        cap = torch.cuda.get_device_capability(torch.device(device))
        name = "bfloat16" if tuple(cap) >= CUDA_BF16_CAPABILITY else "float32"
        return Precision(name, requested, f"CUDA capability sm{cap[0]}{cap[1]} (bf16 from sm80)")
    probe = (lambda: _cached_cpu_probe(workload)) if probing() else None
    name, reason = cpu_precision(cpu_flags(), probe, workload)
    return Precision(name, requested, reason)


# ------------------------------------------------------------------ the torch.mm peak
@dataclasses.dataclass(frozen=True)
class MatmulPeak:
    """The best rate of an n x n x n torch.mm in one dtype: the machine's practical peak for it."""

    dtype: str
    device: str
    n: int
    gflops: float
    """By wall time."""
    gflops_cpu: float
    """By this process's CPU time (all threads): what counts on a shared CPU, where other jobs stretch wall
    time but not the CPU time per FLOP. Equal to ``gflops`` on CUDA."""

    def to_dict(self) -> dict:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def mm_peak(dtype: str = "float32", device: str = "cpu", max_n: int = 2048, repeats: int = 3,
            min_call_s: float = 0.25, window_s: float = 0.05) -> MatmulPeak:
    """The torch.mm peak in ``dtype``: n doubles from 128 until one product takes ``min_call_s`` or n reaches
    ``max_n``, then the best of ``repeats``. The slow path (bf16 on an AVX2-only CPU, ~1 GFLOP/s) thus stops
    near n=512, well under 2 s, instead of taking ~20 s per 2048^3 product.

    ``window_s``: each of the ``repeats`` runs products for at least that long (their mean counts). Linux
    accounts a process's other threads' CPU time late, so one ~1-ms product (n=512 on 2 cores) misses up to all
    of the worker thread's: its "per CPU-second" rate came out as the wall rate, or half of it, by chance
    (session 16, one machine: bf16 361-437 in single products, 216-219 over 50-ms windows, 212-215 for 2048^3
    products of ~80 ms; on a faster engine a 2048^3 product is a few ms, so the benches' peaks are windowed too).
    0: one product per repeat."""
    import torch

    def sync():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    dt = getattr(torch, dtype)
    n = 128
    while True:
        a, b = torch.randn(n, n, device=device).to(dt), torch.randn(n, n, device=device).to(dt)
        sync()
        w0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        if time.perf_counter() - w0 >= min_call_s or n >= max_n:
            break
        n *= 2
    wall = cpu = float("inf")
    for _ in range(repeats):
        w0, c0, calls = time.perf_counter(), time.process_time(), 0
        while calls == 0 or time.perf_counter() - w0 < window_s:
            torch.mm(a, b)
            sync()
            calls += 1
        wall, cpu = min(wall, (time.perf_counter() - w0) / calls), min(cpu, (time.process_time() - c0) / calls)
    flops = 2 * n**3 / 1e9
    on_cuda = str(device).startswith("cuda")
    return MatmulPeak(dtype, str(device), n, flops / wall, flops / (wall if on_cuda else max(cpu, 1e-9)))


def mm_peaks(device: str = "cpu", max_n: int = 2048, cpu_time: bool = False,
             earlier: dict[str, MatmulPeak] | None = None) -> dict[str, MatmulPeak]:
    """Both peaks (fp32 and bf16) measured now, each the better of this and an ``earlier`` measurement (a bench
    measures before and after its runs: the machine may be shared). "Fraction of the best peak" divides by the
    larger of the two (``best_peak``)."""
    now = {d: mm_peak(d, device, max_n=max_n) for d in ("float32", "bfloat16")}
    if earlier is None:
        return now
    rate = (lambda pk: pk.gflops_cpu) if cpu_time else (lambda pk: pk.gflops)
    return {d: max(now[d], earlier[d], key=rate) for d in now}


SLOW_PATH_SHARE = 0.1
"""A dtype whose torch.mm peak is under this share of the best one is the machine's slow path (bf16 on an
AVX2-only CPU: ~1 vs ~100+ GFLOP/s); the benches measure it on a reduced shape."""


def best_peak(peaks: dict[str, MatmulPeak], cpu_time: bool = False) -> MatmulPeak:
    """The larger peak (by CPU time on a shared CPU, else by wall time): what "fraction of peak" divides by."""
    return max(peaks.values(), key=lambda pk: pk.gflops_cpu if cpu_time else pk.gflops)


def is_slow_path(peaks: dict[str, MatmulPeak], dtype: str, cpu_time: bool = False) -> bool:
    rate = (lambda pk: pk.gflops_cpu) if cpu_time else (lambda pk: pk.gflops)
    return rate(peaks[dtype]) < SLOW_PATH_SHARE * rate(best_peak(peaks, cpu_time))
