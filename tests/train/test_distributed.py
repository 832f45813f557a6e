"""Data-parallel: 2 processes through torchrun on CPU (gloo) give the same loss
curve as 1 process with the same effective batch (64 tokens x 1 x 2 ranks = 64 x 2 x 1)."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.train.train_helpers import REPO
from eagle3.train.loop import train
from eagle3.checkpoint import read_metrics
from eagle3.serving.process import free_port
from eagle3.train.config import BUDGET_REFIT_STEPS
from tests.train.test_loop import cfg_for, losses

STEPS = 6


def _torchrun_train(tiny_store, out, grad_accum: int, *extra: str) -> subprocess.CompletedProcess:
    """`eagle3 train` on 2 gloo ranks through torchrun; asserts it exits 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "eagle3", "train",
           "--store", tiny_store["store"], "--vocab", tiny_store["vocab"], "--out", str(out),
           "--ttt-length", "3", "--token-budget", "64", "--grad-accum", str(grad_accum), "--lr", "3e-3",
           "--max-steps", str(STEPS), "--log-every", "1", "--save-every", "3", "--eval-every", "3",
           "--init", "random", "--device", "cpu", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_two_gloo_ranks_match_one_process(tiny_store, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "ddp"
    proc = _torchrun_train(tiny_store, out, 1)
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])  # rank 0 only prints it
    assert summary["world_size"] == 2 and proc.stdout.count('"world_size"') == 1

    ref = tmp_path / "one"
    train(cfg_for(tiny_store, ref, token_budget=64, grad_accum=2, max_steps=STEPS, eval_every=3, save_every=3))
    assert len(losses(out)) == STEPS
    assert losses(out) == pytest.approx(losses(ref), rel=1e-4, abs=1e-5)
    ev_ddp = [e["sim_accept_len"] for e in read_metrics(str(out / "metrics.jsonl"), "eval")]
    ev_one = [e["sim_accept_len"] for e in read_metrics(str(ref / "metrics.jsonl"), "eval")]
    assert len(ev_ddp) == 2 and ev_ddp == pytest.approx(ev_one, rel=1e-4)
    rows = read_metrics(str(out / "metrics.jsonl"), "train")
    assert all(r["world_size"] == 2 for r in rows)
    # rank 0 wrote one metrics line per step (no duplicates from rank 1)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # the ranks split each batch: summed over ranks, the trained positions equal one process's, not twice
    one = read_metrics(str(ref / "metrics.jsonl"), "train")
    assert [r["tokens_0"] for r in rows] == [r["tokens_0"] for r in one]


def test_nproc_launcher_keeps_exit_code_75_for_an_oom(tiny_store, tmp_path):
    """`eagle3 train --nproc 2` runs torchrun and still exits 75 on an OOM (torchrun alone would exit 1)."""
    from tests.train.train_helpers import run_cli
    from eagle3 import checkpoint
    from eagle3.oom import INJECT_ENV

    out = tmp_path / "ddp-oom"
    args = ["--store", tiny_store["store"], "--vocab", tiny_store["vocab"], "--out", str(out), "--ttt-length", "2",
            "--token-budget", "128", "--max-steps", "2", "--init", "random", "--device", "cpu", "--nproc", "2"]
    proc = run_cli(args, {INJECT_ENV: "64"}, timeout=600)
    assert proc.returncode == 75, proc.stderr[-4000:]
    state = checkpoint.load_latest(str(out)).state
    assert (state["token_budget"], state["grad_accum"], state["world_size"]) == (64, 2, 2)


def _args(tiny_store, out, steps: int) -> list[str]:
    return ["--store", tiny_store["store"], "--vocab", tiny_store["vocab"], "--out", str(out), "--ttt-length", "2",
            "--token-budget", "64", "--max-steps", str(steps), "--epochs", str(steps), "--init", "random",
            "--device", "cpu",
            "--log-every", "1", "--save-every", "1000", "--eval-every", "0", "--nproc", "2"]


def test_nproc_launcher_hands_rank_0s_summary_to_result(tiny_store, tmp_path):
    """What the Airflow task reads: `--result` of `eagle3 train --nproc 2` holds the run's summary."""
    from tests.train.train_helpers import run_cli

    result = tmp_path / "result.json"
    proc = run_cli([*_args(tiny_store, tmp_path / "ddp", 2), "--result", str(result)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(result.read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2 and summary["checkpoint"].endswith("step-00000002")


def _marked(mark: str) -> list[int]:
    """Pids of live processes whose environment holds ``mark`` (this test's workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark.encode() in open(f"/proc/{entry}/environ", "rb").read():
                state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("kill", ["sigterm_to_the_launcher", "sigkill_to_the_group"])
def test_a_killed_launcher_leaves_no_worker_behind(tiny_store, tmp_path, kill):
    """torchrun starts its workers in sessions of their own, so neither a kill of the launcher nor a SIGKILL of
    the task's process group (Airflow's kill after its grace) reaches them. On a SIGTERM the launcher has torchrun
    stop them; on a SIGKILL of launcher and torchrun each worker is told by Linux (PR_SET_PDEATHSIG)."""
    import signal
    import time
    import uuid

    mark = f"EAGLE3_TEST_MARK_{uuid.uuid4().hex}"
    out = tmp_path / "ddp"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **{mark: "1"})
    log = open(tmp_path / "train.log", "wb")  # a file, not a pipe: a worker writing to a closed pipe would die anyway
    launcher = subprocess.Popen([sys.executable, "-m", "eagle3.cli", "train", *_args(tiny_store, out, 100000)],
                                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").exists() or '"event": "train"' not in (out / "metrics.jsonl").read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(1)
        assert len(_marked(mark)) >= 4  # the launcher, torchrun and its two workers
        if kill == "sigterm_to_the_launcher":
            launcher.send_signal(signal.SIGTERM)
            assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        else:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        assert '"world_size"' not in (tmp_path / "train.log").read_text()  # killed while training (no summary)
        deadline = time.monotonic() + 60
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _marked(mark) == [], "workers outlived torchrun"
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_sequence_parallel_ranks_match_one_process(tiny_store, tmp_path):
    """`--sequence-parallel` on 2 gloo ranks: both read the same micro-batches and split their positions; the
    loss curve, the held-out figures and the trained-position counts equal one process's with the same batch."""
    torch.set_num_threads(1)
    out = tmp_path / "sp"
    _torchrun_train(tiny_store, out, 2, "--sequence-parallel", "--precision", "float32")
    ref = tmp_path / "one"
    # fp32 both: in bf16 the ranks' shorter matmuls round differently from one process's
    train(cfg_for(tiny_store, ref, token_budget=64, grad_accum=2, max_steps=STEPS, eval_every=3, save_every=3,
                  precision="float32"))
    assert losses(out) == pytest.approx(losses(ref), rel=1e-5, abs=1e-6)
    ev_sp = [e["sim_accept_len"] for e in read_metrics(str(out / "metrics.jsonl"), "eval")]
    ev_one = [e["sim_accept_len"] for e in read_metrics(str(ref / "metrics.jsonl"), "eval")]
    assert len(ev_sp) == 2 and ev_sp == pytest.approx(ev_one, rel=1e-4)
    rows, one = (read_metrics(str(d / "metrics.jsonl"), "train") for d in (out, ref))
    assert [r["tokens_0"] for r in rows] == [r["tokens_0"] for r in one]  # not twice: each rank held a share


def test_sequence_parallel_refuses_online():
    from eagle3.errors import InputError
    from eagle3.train.config import TrainConfig

    with pytest.raises(InputError, match="sequence_parallel is for offline training"):
        TrainConfig(out="x", vocab="v", online=True, merged="m", model="t", sequence_parallel=True)


def test_two_gloo_ranks_under_a_time_budget_agree_on_every_total(tiny_store, tmp_path):
    """The budget's fix, refit and checks happen on any rank's clock (each times its own steps); the call is
    taken together and every rank takes the smallest total, so both end at the same step, with no hang. (A
    rank whose share of a global batch is empty adds zero gradients: it crashed in torch.cat before.)"""
    out = tmp_path / "budget"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "eagle3", "train",
           "--store", tiny_store["store"], "--vocab", tiny_store["vocab"], "--out", str(out),
           "--ttt-length", "3", "--token-budget", "64", "--lr", "3e-3", "--train-time-budget", "6",
           "--log-every", "10", "--save-every", "100000", "--init", "random", "--device", "cpu"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    budget = summary["budget"]
    assert summary["world_size"] == 2 and budget["fixed"] and "refit" in budget["measured"], budget
    assert summary["steps"] == summary["total_steps"] == budget["total_steps"] > BUDGET_REFIT_STEPS
    # Both ranks log each step's total and learning rate: every line comes in a pair (a rank on another curve
    # would log its own).
    steps = re.findall(r"step (\d+)/(\d+) loss \S+ acc_0 \S+ lr (\S+)", proc.stderr)
    totals = re.findall(r"time budget \S+ s: .*?(\d+) steps in all", proc.stderr)
    assert steps and totals and int(steps[-1][0]) == summary["steps"], proc.stderr[-3000:]
    assert all(n % 2 == 0 for n in collections.Counter(steps).values()), steps
    assert all(n % 2 == 0 for n in collections.Counter(totals).values()), totals


def _longest(tiny_store) -> int:
    from eagle3.extract.store import HiddenStateStore

    store = HiddenStateStore(tiny_store["store"])
    return max(store.num_tokens(sid) for sid in store.sample_ids())


RANK0_OOM = """
import sys

import torch

from eagle3.train import loop
from eagle3.train.config import TrainConfig

real, seen = loop.Trainer._micro, {"n": 0}


def micro(self, ids, denominators, grad):
    # rank 0, which holds the larger share of each row, runs out of memory in its 2nd micro-batch of step 3
    if grad and self.step == 2:
        seen["n"] += 1
        if seen["n"] == 2 and self.dist.rank == 0:
            raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 0 only)")
    return real(self, ids, denominators, grad)


loop.Trainer._micro = micro
store, vocab, out = sys.argv[1:4]
loop.train(TrainConfig(store=store, vocab=vocab, out=out, ttt_length=3, token_budget=64, grad_accum=2, lr=3e-3,
                       log_every=1, eval_every=0, save_every=100, epochs=1, init="random", device="cpu",
                       sequence_parallel=True, max_steps=5, precision="float32"))
"""


def test_sequence_parallel_oom_on_one_rank_saves_and_stops_instead_of_hanging(tiny_store, tmp_path):
    """With sequence parallelism the other ranks are inside the micro-batch's collectives when one runs out of
    memory, so the ranks cannot agree on it: the failing rank saves the halved state alone and exits, and torchrun
    stops the rest (it used to hang every rank until the collective timeout)."""
    script = tmp_path / "rank0_oom.py"
    script.write_text(RANK0_OOM)
    out = tmp_path / "sp-oom"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), tiny_store["store"],
           tiny_store["vocab"], str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0 and "GpuOutOfMemory" in proc.stderr, proc.stderr[-3000:]
    from eagle3 import checkpoint

    state = checkpoint.load_latest(str(out)).state
    # after step 2, half of the 64-token micro-batch, or one sample's budget where half would not hold the longest
    assert (state["token_budget"], state["grad_accum"], state["position"]["index"]) == (max(32, _longest(tiny_store)),
                                                                                         4, 2)
