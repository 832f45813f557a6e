"""Our draft training step next to a peer's core, same shapes, threads and precision, alternating, in one run.

The peer: speculators 0.9.0's `Eagle3DraftModel` (its forward runs the TTT loop and the loss; on CPU it is
eager, `conditional_torch_compile` compiles on CUDA only). It is installed in a scratch venv of its own,
outside this repository (it pins transformers <= 5.19):

    python3 -m venv /work/peer-venv
    /work/peer-venv/bin/pip install torch==2.13.0
    /work/peer-venv/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    /work/peer-venv/bin/pip install "transformers<=5.19" "pydantic>=2" pydantic-settings loguru \\
        safetensors tqdm psutil rich click typer huggingface-hub protobuf openai httpx aiohttp "datasets<=5.1"

On CPU the peer needs `sdpa` attention (its default is flex attention) and its eager loss
(`speculators.losses.eager.kl_div_loss`; the default one is a Triton kernel). Its lm_head is frozen by default:
here it is trained, as ours is. Both sides run one optimizer step per iteration on one row of --seq-len tokens:
the target's soft labels from `last` (ours: the full-vocab lm_head for the in-draft mask, then the draft-vocab
rows; the peer: a draft-vocab `verifier_lm_head`), --ttt-length TTT steps with step weight 0.8^i, backward,
grad-norm clip 0.5, AdamW. Each worker is a fresh process with --threads torch threads; they alternate
--rounds times. Counted FLOPs are bench/train_bench.py's (the same number for both), so the fraction of the
best peak (the fp32 and bf16 `torch.mm` peaks of eagle3.devices.mm_peaks, by process CPU time) compares speed.

usage: .venv/bin/python bench/peer_bench.py [--peer-python /work/peer-venv/bin/python]
       [--precision bfloat16] [--seq-len 1024] [--ttt-length 7] [--vd 8192] [--threads 2] [--rounds 2]
       [--iters 2] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

# The caller's OpenMP wait policy reaches both sides' workers alike (docs/train.md "Speed").
THREAD_WAIT_VARS = ("OMP_WAIT_POLICY",)
DEFAULT_PEER_PYTHON = "/work/peer-venv/bin/python"
H, I, HEADS, KV, V = 576, 1536, 9, 3, 49152


def _timed(step, iters: int) -> tuple[float, float]:
    step()
    wall, cpu = float("inf"), float("inf")
    for _ in range(iters):
        w, c = time.perf_counter(), time.process_time()
        step()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def worker_ours(args) -> dict:
    import torch
    from train_bench import build

    from eagle3.draft.ttt import target_from_last, ttt_forward

    torch.set_num_threads(args.threads)
    draft, head, opt = build(args.vd, "cpu")
    t = args.seq_len
    ids, aux, last = torch.randint(0, V, (1, t)), torch.randn(1, t, 3 * H), torch.randn(1, t, H)
    mask = torch.ones(1, t, dtype=torch.long)
    fwd = ttt_forward
    if args.compile:
        fwd = torch.compile(ttt_forward)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16"):
            with torch.no_grad():
                logits, in_draft = target_from_last(last, head, draft.d2t, draft.t2d)
            res = fwd(draft, ids, aux, logits, torch.ones_like(in_draft), mask, ttt_length=args.ttt_length)
        opt.zero_grad(set_to_none=True)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()

    wall, cpu = _timed(step, args.iters)
    return {"wall_s": wall, "cpu_s": cpu}


def worker_peer(args) -> dict:
    import torch
    from transformers import LlamaConfig

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.losses.eager import kl_div_loss
    from speculators.models.eagle3.config import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tl = LlamaConfig(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS, num_key_value_heads=KV,
                     head_dim=H // HEADS, num_hidden_layers=1, vocab_size=V, rms_norm_eps=1e-5,
                     max_position_embeddings=8192, rope_theta=100000.0)
    tl._attn_implementation = "sdpa"  # noqa: SLF001 - flex attention is the default; CPU runs sdpa
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=args.vd, norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[1, 14, 26],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args.ttt_length)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=None, architectures=[])))
    model = Eagle3DraftModel(cfg)
    with torch.no_grad():  # random weights instead of NaNs (no verifier to load); speed only
        for p in [*model.parameters(), *model.buffers()]:
            if p.is_floating_point():
                p.copy_(torch.randn_like(p) * 0.02 if p.dim() > 1 else torch.ones_like(p))
    model.lm_head.weight.requires_grad_(True)  # trained, as ours is
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))
    t = args.seq_len
    hs, ids, last = torch.randn(1, t, 3 * H), torch.randint(0, V, (1, t)), torch.randn(1, t, H)
    docs, mask = torch.ones(1, t, dtype=torch.long), torch.ones(1, t, dtype=torch.bool)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16"):
            _, loss, _ = model(hs, ids, docs, loss_mask=mask, verifier_last_hidden_states=last,
                               ttt_steps=args.ttt_length, ttt_step_loss_decay=0.8,
                               loss_config={"kl_div": (kl_div_loss, 1.0)})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.5)
        opt.step()

    wall, cpu = _timed(step, args.iters)
    return {"wall_s": wall, "cpu_s": cpu}


def alternate(peer_python: str, precision: str, seq_len: int, ttt_length: int, vd: int, threads: int,
              iters: int, rounds: int, compile_ours: bool = False, malloc: str = "tuned") -> dict[str, list[dict]]:
    """``rounds`` x (our worker, the peer's worker), each a fresh process: their {wall_s, cpu_s} runs.

    ``malloc`` "tuned": both workers' glibc gets the trainer's settings (eagle3/memory.py CPU_MALLOC, through the
    environment), so the two step codes are compared on the same allocator; "default": glibc's defaults."""
    from eagle3.memory import cpu_malloc_env

    passthrough = ["--precision", precision, "--seq-len", str(seq_len), "--ttt-length", str(ttt_length),
                   "--vd", str(vd), "--threads", str(threads), "--iters", str(iters)]
    passthrough += ["--compile"] if compile_ours else []
    env = {"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           **{k: os.environ[k] for k in THREAD_WAIT_VARS if k in os.environ},
           **(cpu_malloc_env() if malloc == "tuned" else {})}
    runs: dict[str, list[dict]] = {"ours": [], "peer": []}
    for _ in range(rounds):
        for who, python in (("ours", sys.executable), ("peer", peer_python)):
            out = subprocess.run([python, __file__, "--worker", who, *passthrough], capture_output=True, text=True,
                                 env=env)
            if out.returncode:
                raise SystemExit(f"{who} worker failed:\n{out.stderr[-3000:]}")
            runs[who].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def summarize(runs: dict[str, list[dict]], peaks: dict, best, precision: str, seq_len: int, counted: float) -> dict:
    """Per side: tok/s (best wall), CPU s per step (best), counted GFLOP per CPU second and the fractions."""
    summary = {}
    for who, rs in runs.items():
        wall, cpu = min(r["wall_s"] for r in rs), min(r["cpu_s"] for r in rs)
        summary[who] = {"tokens_per_s_wall": round(seq_len / wall, 1), "step_cpu_s": round(cpu, 3),
                        "counted_gflops_cpu": round(counted / cpu / 1e9, 1),
                        "fraction_of_best_peak": round(counted / cpu / 1e9 / best.gflops_cpu, 3),
                        "fraction_of_own_peak": round(counted / cpu / 1e9 / peaks[precision].gflops_cpu, 3),
                        "runs": rs}
    summary["ours_vs_peer_speed"] = round(summary["peer"]["step_cpu_s"] / summary["ours"]["step_cpu_s"], 3)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    ap.add_argument("--precision", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--ttt-length", type=int, default=7)
    ap.add_argument("--vd", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="ours: torch.compile the TTT forward (as --compile)")
    ap.add_argument("--worker", choices=["ours", "peer"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps((worker_ours if args.worker == "ours" else worker_peer)(args)))
        return

    import torch

    from eagle3.devices import best_peak, mm_peaks
    from train_bench import flops_per_token

    torch.set_num_threads(args.threads)
    before = mm_peaks("cpu")
    runs = alternate(args.peer_python, args.precision, args.seq_len, args.ttt_length, args.vd, args.threads,
                     args.iters, args.rounds, args.compile)
    peaks = mm_peaks("cpu", cpu_time=True, earlier=before)
    best = best_peak(peaks, cpu_time=True)
    f = flops_per_token(args.vd, args.ttt_length)
    summary = summarize(runs, peaks, best, args.precision, args.seq_len,
                        (f["draft_train"] + f["target_head"]) * args.seq_len)
    ratio = summary.pop("ours_vs_peer_speed")
    print(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "worker"},
                      "peaks": {d: pk.to_dict() for d, pk in peaks.items()}, "best_peak": best.dtype,
                      "summary": summary, "ours_vs_peer_speed": ratio}, indent=1))
    print(f"torch.mm peaks (CPU time): fp32 {peaks['float32'].gflops_cpu:.0f}, bf16 {peaks['bfloat16'].gflops_cpu:.0f} "
          f"GFLOP/s; best {best.dtype}")
    for who, s in summary.items():
        print(f"{who:5s} {args.precision} T={args.seq_len} TTT={args.ttt_length} Vd={args.vd} {args.threads} threads"
              f"{' compiled' if who == 'ours' and args.compile else ''}: {s['tokens_per_s_wall']:.0f} tok/s wall, "
              f"{s['step_cpu_s']:.2f} CPU s/step, {100 * s['fraction_of_best_peak']:.0f}% of the best peak")
    print(f"ours / peer speed (CPU time per step): {ratio:.2f}x (goal >= 1.0)")


if __name__ == "__main__":
    main()
