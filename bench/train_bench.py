"""Training benchmark: draft tokens/s per compute precision and the achieved fraction of the best matmul peak.

SmolLM2-sized draft (H=576, I=1536, 9 heads, 3 kv heads, V=49152) on synthetic data,
one optimizer step per iteration exactly as the loop runs a micro-batch:
target_from_last (the target's lm_head over `last`, forward only, fp32), ttt_forward
over --ttt-length steps, backward, grad clip, AdamW (fp32 master weights). Each
precision of --precisions runs side by side in one process: float32 without autocast,
bfloat16 under bf16 autocast (what eagle3.train.loop does where the policy says bf16).
Peaks: the fp32 and the bf16 torch.mm peaks (eagle3.devices.mm_peaks), measured in the
same run before and after the steps; every fraction is of the BEST of them (the larger
of the two peaks), so a run that leaves a faster matrix engine idle shows it.

A precision whose peak is under 10% of the best (bf16 on an AVX2-only CPU: ~1 GFLOP/s)
runs a reduced shape (1 row of seq-len/8, one timed step) so the bench stays short.

Counted FLOPs per token (2*m*n*k per matmul, backward = 2x forward, so train = 3x):
  per TTT step: q/k/v (2H in), o, MLP gate/up/down, draft lm_head (H x Vd); fc (3H -> H) at step 0 only;
  once: target lm_head (H x V, forward only, no grad).
Attention score/value products (O(T^2)) are NOT counted, so the fraction is a lower bound.
Beside each run: the same counted matmuls timed alone at the step's shapes (M = the micro-batch's tokens; forward,
input gradient and weight gradient, in the run's dtype): the ceiling of that fraction on this machine, since the
step runs these products and more. Where it is under the goal, no work outside the matmuls reaches the goal. It is
given by CPU time (the fractions' basis) and by wall time x threads: they differ where the GEMM library runs a
product on fewer threads than it was given (oneDNN 3.12 on a 2-core AMX machine: many of the draft's bf16 products).

--online adds, for each precision, the whole online step (eagle3.train.online) side by side with the
offline one: the target (--model, default the bundled SmolLM2) runs its forward over the micro-batch
through OnlineSource.get_many (capture, encode/decode of --storage-option, collate), then the same draft step.
Its counted FLOPs add the target forward, 2 x (non-embedding target parameters) per token.

--answer-share F puts the loss on the last F of each row only (a prompt, then its answer, as chat data is) and runs
each precision twice side by side: every position (soft labels and TTT steps everywhere: the trainer before
2026-12-03), then the trainer's way (soft labels only where a loss reads them, TTT steps 1.. only where a loss
needs them: eagle3/draft/ttt.py "Sparse steps"); it prints the ratio of their CPU time per step.

--seq-lens L1,L2,... is the long-context mode (docs/train.md "Long context"): one row of each length, each
(precision, attention, length) in its own child process, so the peak RSS (os.wait4's rusage of that child)
is per length. --attention picks the TTT attention (eagle3/draft/attention.py blockwise, the dense [T, T]
reference, or both side by side); dense is skipped where its score tensors alone would not fit in memory.

--peer [PYTHON] (with --rows 1) adds, per precision, the peer core (bench/peer_bench.py: speculators 0.9.0's
Eagle3DraftModel, in its own venv, default /work/peer-venv/bin/python) next to our step: --peer-rounds pairs of
fresh processes, ours then the peer, alternating, same shape, threads and precision, and the same peaks and
counted FLOPs, so both fractions and their ratio come from one run.

--malloc: on the CPU the bench sets glibc malloc as the trainer does (eagle3/memory.py CPU_MALLOC: a fixed 32 MiB
mmap threshold, so the per-step [Vd, H] gradients and logit blocks are reused heap memory, not fresh mappings that
fault); `--malloc default` keeps glibc's defaults; `--malloc default,tuned` runs the whole bench once per setting in
fresh processes (mallopt cannot be undone in a process), alternating --malloc-rounds times, and prints the ratio.

OpenMP: idle workers spin by default (OMP_WAIT_POLICY unset = active), the fastest on a quiet machine;
`OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/train_bench.py ...` measures sleeping workers, which win only on a
host shared with other jobs (docs/train.md "Speed"). The peer's worker gets the same setting as ours.

usage: .venv/bin/python bench/train_bench.py [--precisions float32,bfloat16] [--vd 8192] [--rows 4]
       [--seq-len 512] [--ttt-length 7] [--iters 3] [--online [--model M] [--storage-option bf16]]
       .venv/bin/python bench/train_bench.py --seq-lens 2048,8192 [--attention blockwise,dense]
       [--precisions bfloat16] [--iters 1] [--no-warmup] [--checkpoint-steps]
       .venv/bin/python bench/train_bench.py --rows 1 --seq-len 1024 --threads 2 --iters 2 --peer [PYTHON]
       .venv/bin/python bench/train_bench.py --rows 4 --seq-len 256 --ttt-length 3 --vd 2048 --answer-share 0.45
       .venv/bin/python bench/train_bench.py --rows 1 --seq-len 1024 --threads 2 --malloc default,tuned
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from eagle3.memory import tune_cpu_malloc  # noqa: E402
from eagle3.devices import best_peak, check_precision, is_slow_path, mm_peaks, resolve_precision  # noqa: E402
from eagle3.draft import DraftConfig, Eagle3Draft  # noqa: E402
from eagle3.draft.ttt import label_rows, target_from_last  # noqa: E402
from eagle3.train.objective import ttt_function  # noqa: E402

SHAPES = {  # (H, I, heads, kv heads, V): a draft's widths are its target's
    "smollm2": (576, 1536, 9, 3, 49152),
    "llama3-8b": (4096, 14336, 32, 8, 128256),
    "kimi-k2": (7168, 18432, 64, 64, 163840),  # the widths of docs/train.md's sizing table
}
H, I, HEADS, KV, V = SHAPES["smollm2"]
GPU_MM_N = 8192
"""The torch.mm peak's largest n on a GPU: 2048 leaves an H200 at a fraction of its rate (8192 measured 788
TFLOP/s in bf16 there)."""


def set_shape(name: str) -> None:
    global H, I, HEADS, KV, V
    if name not in SHAPES:
        raise SystemExit(f"--shape {name!r}: use one of {', '.join(SHAPES)}")
    H, I, HEADS, KV, V = SHAPES[name]


def draft_shape(vd: int):
    from eagle3.memory import DraftShape

    return DraftShape(hidden=H, intermediate=I, heads=HEADS, kv_heads=KV, head_dim=H // HEADS, vocab=V,
                      draft_vocab=vd)


def cuda_memory(precision: str, args, tokens: int) -> dict:
    """The step's peaks of torch's CUDA allocator (allocated, and reserved: what the device gives up) next to
    eagle3/memory.py's prediction for the same micro-batch, less its runtime term (the CUDA context is not in the
    allocator's count); the prediction's CUDA_TRAIN_EXCESS models reserved over the counted tensors."""
    from eagle3.memory import GiB, RUNTIME_BYTES, training_peak

    pred = training_peak(draft_shape(args.vd), tokens, args.ttt_length, precision, args.checkpoint_steps,
                         soft_labels=True, device="cuda")["bytes"] - RUNTIME_BYTES["cuda"]
    peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    return {"cuda_peak_gib": round(peak / GiB, 2), "cuda_reserved_gib": round(reserved / GiB, 2),
            "predicted_gib": round(pred / GiB, 2), "measured_over_predicted": round(reserved / pred, 3)}


def timed(fn, device: str, repeat: int, warmup: bool = True) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds) of ``fn``, after one warm-up call if ``warmup``.

    CPU seconds (all threads of this process) are what we compare on a shared
    CPU: a busy machine time-slices us, which stretches wall time but not the
    CPU time spent per FLOP. On CUDA only wall time means anything.
    """
    if warmup:
        fn()
        _sync(device)
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def products(vd: int) -> dict[str, list[tuple[int, int]]]:
    """The counted matmuls as (out, in) widths, each once per token: "step" per TTT step (q, k, v, o, gate, up,
    down, the draft lm_head), "once" at step 0 (fc), "target" forward only (the target lm_head)."""
    hd = H // HEADS
    return {"step": [(HEADS * hd, 2 * H), (KV * hd, 2 * H), (KV * hd, 2 * H), (H, HEADS * hd), (I, H), (I, H),
                     (H, I), (vd, H)],
            "once": [(H, 3 * H)], "target": [(V, H)]}


def flops_per_token(vd: int, ttt_length: int) -> dict[str, float]:
    p = products(vd)

    def forward(ps: list[tuple[int, int]]) -> int:
        return sum(2 * o * i for o, i in ps)

    return {"draft_train": 3 * (ttt_length * forward(p["step"]) + forward(p["once"])),
            "target_head": forward(p["target"])}


def gemm_ceiling(precision: str, vd: int, ttt_length: int, tokens: int, dev: str,
                 repeat: int = 5) -> tuple[float, float]:
    """(counted GFLOP per CPU second, per wall second x threads) of the step's counted matmuls alone (on a GPU
    both are per wall second): every product of `products` timed by itself, with M = ``tokens`` rows, as the
    forward, the input gradient and the weight gradient (the target head: forward only), in the precision's
    dtype. The two differ where a GEMM library runs a product on fewer threads than it has: its CPU time is
    then efficient while the other cores idle. No step of this shape does better here: it runs the same
    products and more."""
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    p = products(vd)
    times: dict[tuple[int, int, bool], int] = {}
    for ps, n, train in ((p["step"], ttt_length, True), (p["once"], 1, True), (p["target"], 1, False)):
        for o, i in ps:
            times[o, i, train] = times.get((o, i, train), 0) + n
    flops = cpu_s = wall_s = 0.0
    cores = torch.get_num_threads() if dev == "cpu" else 1
    for (o, i, train), n in times.items():
        x = torch.randn(tokens, i, dtype=dtype, device=dev)
        w = torch.randn(o, i, dtype=dtype, device=dev)
        dy = torch.randn(tokens, o, dtype=dtype, device=dev)
        for fn in [lambda: x @ w.T] + ([lambda: dy @ w, lambda: dy.T @ x] if train else []):
            wall, cpu = timed(fn, dev, repeat)
            cpu_s += n * (cpu if dev == "cpu" else wall)
            wall_s += n * wall * cores
            flops += n * 2 * tokens * o * i
    return flops / cpu_s / 1e9, flops / wall_s / 1e9


def build(vd: int, dev: str):
    """The draft, the target head and the optimizer, seeded (the same for every precision)."""
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS, num_key_value_heads=KV,
                      head_dim=H // HEADS, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=8192,
                      vocab_size=V, draft_vocab_size=vd, aux_layers=(1, 14, 26))
    d2t = torch.randperm(V)[:vd].sort().values - torch.arange(vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.arange(vd) + d2t] = True
    draft = Eagle3Draft(cfg, torch.randn(V, H, device=dev) * 0.02, d2t, t2d).to(dev)
    for p in draft.parameters():
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
    head = torch.randn(V, H, device=dev) * 0.05  # on the device: Kimi-K2's [V, H] is 4.4 GiB
    return draft, head, torch.optim.AdamW(draft.parameters(), lr=1e-4, betas=(0.9, 0.95))


def online_source(model: str, storage_option: str, precision: str, dev: str, rows: int, seq_len: int):
    """An OnlineSource over ``rows`` random samples of ``seq_len`` tokens, the target on ``dev``."""
    import numpy as np

    from eagle3.extract.capture import TargetCapture
    from eagle3.extract.plan import Sample
    from eagle3.extract.stage import MergedTokens
    from eagle3.train.online import OnlineSource

    cap = TargetCapture(model, dev, precision=precision)
    if (cap.hidden_size, cap.vocab_size) != (H, V):
        raise SystemExit(f"--model {model}: H={cap.hidden_size}, V={cap.vocab_size}; this bench's draft is H={H}, V={V}")
    rng = np.random.default_rng(0)
    ids = rng.integers(3, V, rows * seq_len).astype(np.int32)
    tokens = MergedTokens(ids, np.ones_like(ids, dtype=np.uint8), np.arange(rows + 1, dtype=np.int64) * seq_len)
    samples = {f"s{r}": Sample(f"s{r}", seq_len, r) for r in range(rows)}
    return OnlineSource(cap, storage_option, samples, tokens, "bench"), list(samples)


def run_precision(precision: str, args, dev: str, rows: int, seq_len: int, iters: int, source=None,
                  attention: str = "blockwise", answer_share: float = 0.0, labels_where_read: bool = False) -> dict:
    """One precision's timed optimizer steps: {tokens_per_s, step_wall_s, step_cpu_s, counted GFLOP/s}.

    With ``source`` (online_source()), each step first computes its batch with the target. ``answer_share`` > 0:
    the loss is on the last share of each row only (a prompt, then its answer); ``labels_where_read``: the
    trainer's way, soft labels only where a loss reads them and sparse TTT steps, else every position."""
    from eagle3.train.data import collate

    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    draft, head, opt = build(args.vd, dev)
    b, t = rows, seq_len
    batch = {"input_ids": torch.randint(0, V, (b, t), device=dev), "aux": torch.randn(b, t, 3 * H, device=dev),
             "last": torch.randn(b, t, H, device=dev), "loss_mask": torch.ones(b, t, dtype=torch.long, device=dev)}
    if answer_share:
        batch["loss_mask"][:, : t - max(1, round(answer_share * t))] = 0
    device_type = torch.device(dev).type

    forward = ttt_function(args.compile)

    def step(phase=lambda name: None) -> None:
        nonlocal batch
        if source is not None:
            batch = collate(source[0], source[1], dev)
        phase("labels")
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            with torch.no_grad():
                logits, in_draft = target_from_last(batch["last"], head, draft.d2t, draft.t2d,
                                                    rows=label_rows(batch["loss_mask"]) if labels_where_read else None)
            phase("forward")
            res = forward(draft, batch["input_ids"], batch["aux"], logits, torch.ones_like(in_draft),
                          batch["loss_mask"], ttt_length=args.ttt_length, attention=attention,
                          checkpoint_steps=args.checkpoint_steps, sparse=None if labels_where_read else False)
        opt.zero_grad(set_to_none=True)
        phase("backward")
        res.loss.backward()
        phase("optimizer")
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()
        phase("")

    sec, cpu_sec = timed(step, dev, iters, warmup=not args.no_warmup)
    tokens = b * t
    memory = cuda_memory(precision, args, tokens) if dev.startswith("cuda") and source is None else {}
    if args.phases:
        memory["phases"] = phases(step, dev)
    if args.profile:
        profile(step, dev, args.profile)
    f = flops_per_token(args.vd, args.ttt_length)
    target = 2 * source[0].capture.params() if source is not None else 0
    counted = (f["draft_train"] + f["target_head"] + target) * tokens
    return {"precision": precision, "mode": "online" if source is not None else "offline", "attention": attention,
            "answer_share": answer_share, "labels_where_read": labels_where_read,
            "checkpoint_steps": args.checkpoint_steps,
            "target_gflop_per_token": round(target / 1e9, 4),
            "rows": b, "seq_len": t, "iters": iters, "step_wall_s": round(sec, 3),
            "step_cpu_s": round(cpu_sec, 3), "tokens_per_s": round(tokens / sec, 1),
            "counted_gflops_wall": counted / sec / 1e9, "counted_gflops_cpu": counted / cpu_sec / 1e9,
            "draft_gflops_cpu": f["draft_train"] * tokens / cpu_sec / 1e9, **memory}


LOSS_BLOCKS = ("device", "cpu")


def loss_block_choices(text: str) -> list[str]:
    got = [b.strip() for b in text.split(",") if b.strip()]
    if not got or set(got) - set(LOSS_BLOCKS):
        raise SystemExit(f"--loss-blocks {text!r}: use {' or '.join(LOSS_BLOCKS)}, or both comma-separated")
    return got


@contextlib.contextmanager
def loss_blocks(which: str):
    """The fused loss's block sizes: the device's own (eagle3/memory.py block_sizes), or the CPU's on any device."""
    from eagle3 import memory
    from eagle3.draft import loss

    own = loss.block_sizes
    if which == "cpu":
        loss.block_sizes = lambda device_type: memory.block_sizes("cpu")
    try:
        yield
    finally:
        loss.block_sizes = own


def phases(step, dev: str) -> dict:
    """One more step, synchronised at each phase's edge: {phase: {wall_s, and on CUDA the allocator's peak
    during the phase and what was allocated when it began, GiB}}."""
    cuda = dev.startswith("cuda")
    out, cur = {}, {"name": None, "t": 0.0}

    def phase(name: str) -> None:
        _sync(dev)
        now = time.perf_counter()
        if cur["name"]:
            row = out[cur["name"]] = {"wall_s": round(now - cur["t"], 4)}
            if cuda:
                row.update(start_gib=cur["start"], peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
        if cuda:
            cur["start"] = round(torch.cuda.memory_allocated() / 2**30, 2)
            torch.cuda.reset_peak_memory_stats()
        cur.update(name=name, t=time.perf_counter())

    step(phase)
    return out


def profile(step, dev: str, top: int) -> None:
    """torch.profiler over one step: the ``top`` ops by device time (CUDA) or CPU time, printed."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.startswith("cuda") else [])
    with torch_profile(activities=acts) as prof:
        step()
        _sync(dev)
    key = "cuda_time_total" if dev.startswith("cuda") else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60), flush=True)


def dense_scores_bytes(seq_len: int, ttt_length: int) -> int:
    """What the dense TTT attention keeps per row: about 10 bytes per score (fp32 scores and softmax, the bf16
    probabilities, the mask) per head and TTT step. It matches DESIGN.md's 4.1 GB at 2K and 11.0 GB at 4K."""
    return 10 * ttt_length * HEADS * seq_len * seq_len


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else unlimited."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 1 << 62


ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
"""The --seq-lens children's glibc: a fixed mmap threshold (glibc's initial 128 KiB), so a freed tensor's pages go
back to the system and the peak RSS is what the step allocates. With glibc's default dynamic threshold the freed
memory kept in the threads' arenas varies run to run: identical 4K fp32 steps measured 2.57-3.29 GiB, against
2.50 every time with this setting (eagle3/memory.py predicts 2.39)."""


def child_run(args, dev: str) -> None:
    """One (precision, attention, length) of --seq-lens, in this child process: print its run as JSON."""
    p, attention, t = args.child.split(":")
    print(json.dumps(run_precision(p, args, dev, 1, int(t), args.iters, attention=attention)))


def run_lengths(args, precisions: list[str], dev: str) -> None:
    """--seq-lens: each (precision, attention, length) in a fresh child; tok/s and the child's peak RSS."""
    lengths = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    attentions = [a.strip() for a in args.attention.split(",") if a.strip()]
    passed = ["--shape", args.shape, "--vd", str(args.vd), "--ttt-length", str(args.ttt_length), "--iters", str(args.iters),
              "--device", dev, "--threads", str(args.threads)]
    passed += [f for f, on in (("--no-warmup", args.no_warmup), ("--checkpoint-steps", args.checkpoint_steps),
                               ("--compile", args.compile), ("--phases", args.phases)) if on]
    rows = []
    for p in precisions:
        for t in lengths:
            for a in attentions:
                row = {"precision": p, "attention": a, "seq_len": t}
                need = dense_scores_bytes(t, args.ttt_length)
                if a == "dense" and need > 0.8 * available_bytes():
                    rows.append({**row, "skipped": f"dense scores need ~{need / 2**30:.0f} GiB"})
                    continue
                with tempfile.TemporaryFile("w+") as out:
                    proc = subprocess.Popen([sys.executable, __file__, "--child", f"{p}:{a}:{t}", *passed],
                                            stdout=out, env={**os.environ, **ALLOCATOR_ENV})
                    _, status, usage = os.wait4(proc.pid, 0)
                    out.seek(0)
                    text = out.read().strip()
                row["peak_rss_gib"] = round(usage.ru_maxrss / 2**20, 2)  # ru_maxrss is in KiB on Linux
                if os.waitstatus_to_exitcode(status) == 0 and text:
                    row.update(json.loads(text.splitlines()[-1]))
                else:
                    row["failed"] = f"exit {os.waitstatus_to_exitcode(status)} (killed for memory?)"
                rows.append(row)
                print(json.dumps(row), flush=True)
    ckpt = ", checkpointed TTT steps" if args.checkpoint_steps else ""
    print(f"{args.shape} widths, TTT {args.ttt_length}, Vd {args.vd}, one row, "
          f"{args.threads or torch.get_num_threads()} threads, {dev}{ckpt}:")
    for r in rows:
        mem = (f"CUDA reserved {r['cuda_reserved_gib']:6.2f} GiB (predicted {r['predicted_gib']:6.2f}: "
               f"{r['measured_over_predicted']:.2f}x)" if "cuda_peak_gib" in r else f"peak RSS {r['peak_rss_gib']:5.2f} GiB")
        what = (r.get("skipped") or r.get("failed")
                or f"{r['tokens_per_s']:8,.0f} tok/s  step {r['step_wall_s']:7.1f} s wall {r['step_cpu_s']:7.1f} s "
                   f"CPU  {mem}")
        print(f"  {r['precision']:8s} {r['attention']:9s} T={r['seq_len']:6d}: {what}")


MALLOCS = ("tuned", "default")


def compare_malloc(args, mallocs: list[str]) -> None:
    """--malloc default,tuned: the whole bench once per setting in a fresh process, alternating; the ratio."""
    argv, skip = [], False
    for a in sys.argv[1:]:  # this run's arguments, less --malloc
        if skip or a.startswith("--malloc=") or a == "--malloc":
            skip = a == "--malloc"
            continue
        argv.append(a)
    got: dict[str, list[dict]] = {m: [] for m in mallocs}
    for _ in range(args.malloc_rounds):
        for m in mallocs:
            with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
                subprocess.run([sys.executable, __file__, *argv, "--malloc", m, "--json-out", out.name], check=True,
                               stdout=subprocess.DEVNULL)
                got[m].append(json.load(out))
    print(f"glibc malloc side by side, {args.malloc_rounds} alternating rounds of fresh processes "
          f"(best CPU time per step of each):")
    first = got[mallocs[0]][0]["runs"]
    for i, r in enumerate(first):
        best = {m: min((o["runs"][i] for o in got[m]), key=lambda x: x["step_cpu_s"]) for m in mallocs}
        what = f"{r['mode']} {r['precision']} [{r['rows']}x{r['seq_len']}]"
        for m in mallocs:
            b = best[m]
            print(f"  {m:7s} {what}: {b['tokens_per_s']:,.0f} tok/s (wall), {b['step_cpu_s']:.2f} CPU s/step = "
                  f"{100 * b['fraction_of_best_peak']:.0f}% of the best peak")
        if {"tuned", "default"} <= set(mallocs):
            print(f"  tuned / default {what} (CPU time per step): "
                  f"{best['default']['step_cpu_s'] / best['tuned']['step_cpu_s']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="float32,bfloat16",
                    help="comma-separated compute precisions to run side by side (float32, bfloat16)")
    ap.add_argument("--shape", default="smollm2", help=f"the draft's widths: {', '.join(SHAPES)}")
    ap.add_argument("--vd", type=int, default=8192, help="draft vocab (8192 or 32000)")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--ttt-length", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--online", action="store_true",
                    help="also time the online step (target forward + draft step) next to each offline one")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="--online: the target (H=576, V=49152)")
    ap.add_argument("--storage-option", default="bf16", help="--online: the storage option whose quantisation applies")
    ap.add_argument("--seq-lens", default="", help="long-context mode: comma-separated lengths, one row each")
    ap.add_argument("--attention", default="blockwise,dense",
                    help="--seq-lens: TTT attentions to run side by side (blockwise, dense)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="time the first step too (long lengths: one step dwarfs the one-time set-up)")
    ap.add_argument("--compile", action="store_true",
                    help="the TTT step through torch.compile, as `eagle3 train --compile` runs it")
    ap.add_argument("--phases", action="store_true",
                    help="one more step timed per phase (labels, forward, backward, optimizer); on CUDA with each "
                         "phase's allocator peak")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="torch.profiler over one more step: print the N ops with the most device (or CPU) time")
    ap.add_argument("--loss-blocks", default="device",
                    help="the fused loss's block sizes: device (eagle3/memory.py block_sizes), cpu (the CPU's on "
                         "any device), or 'device,cpu' side by side with the ratio")
    ap.add_argument("--checkpoint-steps", action="store_true",
                    help="activation checkpointing per TTT step (ttt_forward(checkpoint_steps=True))")
    ap.add_argument("--peer", nargs="?", const="/work/peer-venv/bin/python", default="",
                    help="also run the peer core (bench/peer_bench.py, speculators 0.9.0) with this python, "
                         "alternating with our step in fresh processes, same shape; needs --rows 1")
    ap.add_argument("--peer-rounds", type=int, default=2, help="--peer: (ours, peer) process pairs per precision")
    ap.add_argument("--answer-share", type=float, default=0.0,
                    help="loss on the last share of each row only; each precision then runs twice side by side: "
                         "every position (the trainer before 2026-12-03), and labels where read + sparse TTT steps")
    ap.add_argument("--malloc", default="tuned",
                    help="CPU: glibc malloc as the trainer sets it (tuned) or glibc's default; 'default,tuned' runs "
                         "the bench once per setting in fresh processes, alternating, and prints the ratio")
    ap.add_argument("--malloc-rounds", type=int, default=2, help="--malloc with two settings: alternating rounds")
    ap.add_argument("--json-out", default="", help=argparse.SUPPRESS)  # --malloc's children: their results
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # PRECISION:ATTENTION:LENGTH, from --seq-lens
    args = ap.parse_args()
    mallocs = [m.strip() for m in args.malloc.split(",") if m.strip()]
    if not mallocs or set(mallocs) - set(MALLOCS):
        raise SystemExit(f"--malloc {args.malloc!r}: use {', '.join(MALLOCS)} or both, comma-separated")
    dev = args.device
    set_shape(args.shape)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        return child_run(args, dev)
    precisions = [check_precision(p.strip(), "--precisions") for p in args.precisions.split(",") if p.strip()]
    if args.seq_lens:  # its children measure peak RSS with glibc's fixed initial threshold (ALLOCATOR_ENV)
        return run_lengths(args, precisions, dev)
    if len(mallocs) > 1:
        return compare_malloc(args, mallocs)
    if dev == "cpu" and mallocs == ["tuned"]:
        tune_cpu_malloc()
    policy = resolve_precision("auto", dev)
    on_cpu = dev == "cpu"
    if args.peer and (args.rows != 1 or not on_cpu or args.online):
        raise SystemExit("--peer compares one row per step on the CPU, offline: give --rows 1 (and no --online)")

    mm_n = GPU_MM_N if dev.startswith("cuda") else 2048
    before = mm_peaks(dev, max_n=mm_n)
    runs = []
    for p in precisions:
        slow = is_slow_path(before, p, cpu_time=on_cpu)
        rows, seq_len, iters = (1, max(16, args.seq_len // 8), 1) if slow else (args.rows, args.seq_len, args.iters)
        if args.answer_share:
            for where_read in (False, True):
                runs.append({**run_precision(p, args, dev, rows, seq_len, iters, answer_share=args.answer_share,
                                             labels_where_read=where_read), "reduced_shape": slow})
            continue
        for blocks in loss_block_choices(args.loss_blocks):
            with loss_blocks(blocks):
                runs.append({**run_precision(p, args, dev, rows, seq_len, iters), "reduced_shape": slow,
                             "loss_blocks": blocks})
        if args.online:
            src = online_source(args.model, args.storage_option, p, dev, rows, seq_len)
            runs.append({**run_precision(p, args, dev, rows, seq_len, iters, src), "reduced_shape": slow,
                         "target_forward": src[0].capture.forward_path})
    peer_runs = {}
    if args.peer:
        import peer_bench

        for p in precisions:
            if not any(r["precision"] == p and not r["reduced_shape"] for r in runs):
                continue
            peer_runs[p] = peer_bench.alternate(args.peer, p, args.seq_len, args.ttt_length, args.vd,
                                                args.threads or torch.get_num_threads(), args.iters,
                                                args.peer_rounds, malloc=mallocs[0])
    peaks = mm_peaks(dev, max_n=mm_n, cpu_time=on_cpu, earlier=before)  # again after the steps: the machine may be shared
    rate = (lambda pk: pk.gflops_cpu) if on_cpu else (lambda pk: pk.gflops)
    best = best_peak(peaks, cpu_time=on_cpu)
    for r in runs:
        achieved = r["counted_gflops_cpu"] if on_cpu else r["counted_gflops_wall"]
        r["fraction_of_best_peak"] = round(achieved / rate(best), 3)
        r["fraction_of_own_peak"] = round(achieved / rate(peaks[r["precision"]]), 3)
        r["draft_only_fraction_of_best_peak"] = round(r["draft_gflops_cpu"] / rate(best), 3) if on_cpu else None
        for k in ("counted_gflops_wall", "counted_gflops_cpu", "draft_gflops_cpu"):
            r[k] = round(r[k], 1)
    ceilings = {}  # (precision, tokens): the step's matmuls alone (gemm_ceiling); not on a slow path (minutes)
    for r in runs:
        key = (r["precision"], r["rows"] * r["seq_len"])
        if not r["reduced_shape"] and key not in ceilings:
            ceilings[key] = gemm_ceiling(key[0], args.vd, args.ttt_length, key[1], dev)
        ceiling = ceilings.get(key)
        r["gemm_ceiling_fraction_of_best_peak"] = None if ceiling is None else round(ceiling[0] / rate(best), 3)
        r["gemm_ceiling_wall_fraction_of_best_peak"] = None if ceiling is None else round(ceiling[1] / rate(best), 3)
    peers = {}
    if peer_runs:
        import peer_bench

        f = flops_per_token(args.vd, args.ttt_length)
        peers = {p: peer_bench.summarize(pr, peaks, best, p, args.seq_len,
                                         (f["draft_train"] + f["target_head"]) * args.seq_len)
                 for p, pr in peer_runs.items()}
    out = {
        "device": dev, "malloc": mallocs[0], "peer": peers, "threads": torch.get_num_threads(), "vd": args.vd,
        "ttt_length": args.ttt_length,
        "policy": policy.to_dict(), "peak_basis": "process CPU time" if on_cpu else "wall time",
        "peaks": {d: pk.to_dict() for d, pk in peaks.items()}, "best_peak": best.dtype,
        "peaks_before": {d: pk.to_dict() for d, pk in before.items()},
        "runs": runs,
        "gflop_per_token": {k: round(v / 1e9, 4) for k, v in flops_per_token(args.vd, args.ttt_length).items()},
    }
    print(json.dumps(out, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out))
    basis = "by CPU time" if on_cpu else "by wall time"
    print(f"torch.mm peaks ({basis}): fp32 {rate(peaks['float32']):.1f} GFLOP/s (n={peaks['float32'].n}), "
          f"bf16 {rate(peaks['bfloat16']):.1f} (n={peaks['bfloat16'].n}); best {best.dtype}. "
          f"Policy here: {policy.name} ({policy.reason})")
    for r in runs:
        shape = f"{r['rows']}x{r['seq_len']}" + (" reduced: slow path" if r["reduced_shape"] else "")
        if r["answer_share"]:
            shape += ", labels where read + sparse steps: FLOPs counted as every position's" \
                if r["labels_where_read"] else ", every position"
        if "cuda_peak_gib" in r:
            shape += f", CUDA reserved {r['cuda_reserved_gib']:.2f} GiB (predicted {r['predicted_gib']:.2f})"
        if r.get("loss_blocks", "device") != "device":
            shape += f", the loss in {r['loss_blocks']}-sized blocks"
        print(f"train {r['mode']:7s} {r['precision']:8s} [{shape}]: {r['tokens_per_s']:,.0f} tok/s (wall) | "
              f"counted matmuls "
              f"{r['counted_gflops_cpu' if on_cpu else 'counted_gflops_wall']:.1f} GFLOP/s = "
              f"{100 * r['fraction_of_best_peak']:.0f}% of the best peak ({best.dtype}), "
              f"{100 * r['fraction_of_own_peak']:.0f}% of its own dtype's (goal >= 50% of the best)")
        if r["gemm_ceiling_fraction_of_best_peak"] is not None:
            wall = f", {100 * r['gemm_ceiling_wall_fraction_of_best_peak']:.0f}% by wall time x threads" \
                if on_cpu else ""
            print(f"  {'':7s} {r['precision']:8s} its counted matmuls alone, at the same shapes: "
                  f"{100 * r['gemm_ceiling_fraction_of_best_peak']:.0f}% of the best peak{wall} (no step of this "
                  f"shape does better here)")
    for p in precisions:
        pair = {r["loss_blocks"]: r for r in runs if r["precision"] == p and "loss_blocks" in r}
        if {"device", "cpu"} <= set(pair):
            print(f"  {p}: the loss in the device's blocks / in the CPU's: "
                  f"{pair['cpu']['step_wall_s'] / pair['device']['step_wall_s']:.2f}x faster (wall per step)")
    if args.answer_share:
        for p in precisions:
            every, where = (next(r for r in runs if r["precision"] == p and r["labels_where_read"] == w)
                            for w in (False, True))
            print(f"answer share {args.answer_share:.2f}, {p}: labels where read + sparse steps "
                  f"{where['tokens_per_s']:,.0f} tok/s vs every position {every['tokens_per_s']:,.0f} = "
                  f"{every['step_cpu_s'] / where['step_cpu_s']:.2f}x by CPU time (the counted FLOPs above are every "
                  f"position's, so the sparse run's fraction is an equivalent, not what ran)")
    for p, sm in peers.items():
        for who in ("ours", "peer"):
            x = sm[who]
            print(f"  {who:4s} {p:8s} [1x{args.seq_len}] fresh processes x{len(x['runs'])}: "
                  f"{x['tokens_per_s_wall']:,.0f} tok/s (wall), {x['step_cpu_s']:.2f} CPU s/step = "
                  f"{100 * x['fraction_of_best_peak']:.0f}% of the best peak")
        print(f"  ours / peer speed {p} (CPU time per step): {sm['ours_vs_peer_speed']:.2f}x (goal >= 1.0)")


if __name__ == "__main__":
    main()
