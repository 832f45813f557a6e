"""The training loop: `train(cfg) -> summary`.

One optimizer step = one global batch of the deterministic plan (eagle3/train/
data.py). Every rank runs its slice of it as micro-batches, the gradients are
summed across micro-batches and ranks, clipped, and AdamW (fp32 master
weights and moments) steps with a cosine schedule. The forward and backward
run under bf16 autocast where eagle3.devices.resolve_precision says bf16 (CUDA
sm80+, CPUs with a bf16 matrix engine), in fp32 elsewhere; the target's soft
labels are fp32 either way (eagle3.draft.ttt.target_from_last). The run can be
killed at any moment: it resumes from CKPT/latest.json with the same weights,
optimizer moments, data position and RNG states, so the loss curve continues
as if nothing happened. An out-of-memory saves the state with half the
micro-batch and twice the accumulation and raises GpuOutOfMemory (exit 75).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from time import perf_counter  # first-sight timing: real seconds even where a test replaces `time`

import torch

from eagle3.errors import GpuOutOfMemory, InputError, is_oom
from eagle3.oom import halve, maybe_inject
from eagle3.progress import Progress
from eagle3 import checkpoint, memory, storage
from eagle3.checkpoint import state as ckpt_state
from eagle3.train import data, distributed, objective
from eagle3.train.budget import TimeBudget
from eagle3.draft.sequence import SeqShard
from eagle3.train.config import TrainConfig, lr_at
from eagle3.train.inputs import TrainInputs, load_inputs

log = logging.getLogger(__name__)

NONFINITE_LIMIT = 3
"""Steps in a row whose gradient norm is NaN or inf before the run stops: one such step is skipped (no update,
so the weights stay finite), several in a row mean the run diverged."""

RESUME_EFFECTS = {
    "seed": "the data order changes from here on (this epoch's rest too: samples may repeat or be skipped)",
    "heldout_share": "the held-out split changes: samples trained on may now be held out, and the reverse",
    **dict.fromkeys(("lr", "warmup_ratio", "min_lr_ratio"),
                    "the learning-rate curve changes from here on (a time budget keeps its fixed warm-up)"),
    **dict.fromkeys(("betas", "weight_decay"), "ignored: the optimizer keeps the checkpoint's"),
    "train_time_budget": "the checkpoint's budget (or none) is kept; with a deadline it is the floor of what is left",
}
"""What a setting changed between a checkpoint and the run that resumes it does (each is logged as a warning)."""


def _warn_changed_settings(cfg: TrainConfig, saved: dict, out: str) -> None:
    changed = {k: (saved[k], getattr(cfg, k)) for k in RESUME_EFFECTS
               if k in saved and _comparable(saved[k]) != _comparable(getattr(cfg, k))}
    for k, (was, now) in changed.items():
        log.warning("resuming %s with %s=%r (the checkpoint's run had %r): %s", out, k, now, was, RESUME_EFFECTS[k])


def _comparable(value):
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else value


class TrainingDiverged(InputError):
    """The gradients stayed non-finite: the settings (lr, data) need changing, so a retry would not help."""


def train(cfg: TrainConfig) -> dict:
    """Train (or resume) the draft described by ``cfg``; returns a JSON-able summary.

    Raises InputError for bad input (never retried) and GpuOutOfMemory after
    an OOM whose adapted state is saved (retry to resume).
    """
    dist = distributed.setup(cfg.device)
    if torch.device(dist.device).type == "cpu" and memory.tune_cpu_malloc():
        log.info("glibc malloc: %s (eagle3/memory.py CPU_MALLOC)", memory.CPU_MALLOC)
    try:
        inputs = load_inputs(cfg, dist.device)
        try:
            return Trainer(cfg, inputs, dist).run()
        finally:  # online: stops the target's server and the prefetch thread
            inputs.source.close()
    finally:
        dist.close()


class Trainer:
    def __init__(self, cfg: TrainConfig, inputs: TrainInputs, dist: distributed.Dist):
        self.cfg, self.inp, self.dist = cfg, inputs, dist
        # Sequence parallel: every process reads the same samples and takes its share of their positions.
        self.seq_parallel = cfg.sequence_parallel and dist.world > 1
        self.data_rank, self.data_world = (0, 1) if self.seq_parallel else (dist.rank, dist.world)
        self.device = torch.device(dist.device)
        self.lengths = inputs.lengths
        self.ckpt = checkpoint.load_latest(cfg.out)
        if self.ckpt is None:
            self.model = inputs.fresh_draft().to(self.device)
            self.step, self.pos = 0, data.Position()
            self.micro, self.accum = cfg.token_budget, cfg.grad_accum
            self.global_tokens = cfg.token_budget * cfg.grad_accum * self.data_world
        else:
            st = self.ckpt.state
            self.model = inputs.draft_from_checkpoint(self.ckpt).to(self.device)
            self.step, self.pos = self.ckpt.step, data.Position(**st["position"])
            self.micro, self.accum, self.global_tokens = st["token_budget"], st["grad_accum"], st["global_tokens"]
            if (self.micro, self.accum) != (cfg.token_budget, cfg.grad_accum):
                log.info("resuming with the checkpoint's micro-batch %d tokens x grad_accum %d "
                         "(not --token-budget %d --grad-accum %d)", self.micro, self.accum,
                         cfg.token_budget, cfg.grad_accum)
        if self.ckpt is not None:
            _warn_changed_settings(cfg, self.ckpt.state.get("train_config") or {}, cfg.out)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.names = {p: n for n, p in self.model.named_parameters()}
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        if self.ckpt is not None:
            ckpt_state.load_optimizer(self.opt, self.ckpt.optimizer, self.ckpt.state["optimizer"], self.names)
            ckpt_state.set_rng_state(self.ckpt.state["rng"])
        self.plans: dict[int, list[list[str]]] = {}
        self.nonfinite = 0  # steps in a row skipped for a NaN/inf gradient norm
        self.total_steps = self._total_steps()
        # A time budget fixes total_steps after the first steps (eagle3/train/budget.py); a resumed run keeps
        # what its checkpoint fixed. Its warm-up follows the plan, not max_steps, so a run capped at the
        # steps another budget run fixed has that run's schedule.
        if self.ckpt is not None:
            self.budget = TimeBudget.resume(self.ckpt.state, cfg)
        elif cfg.schedule_from:  # another run's fixed schedule, untimed (bench/paired_bench.py)
            self.budget = TimeBudget.replay(cfg.schedule_from)
        else:
            self.budget = TimeBudget.start(cfg, self._total_steps(capped=False))
        if self.budget is not None and self.budget.fixed:
            self.total_steps = self.budget.total_steps
            if self.budget.replayed and cfg.max_steps:
                self.total_steps = min(self.total_steps, cfg.max_steps)
        self.head = inputs.target_head(self.device)
        self.in_draft = objective.InDraftCache()  # the full-vocab head runs once per sample (objective.py)
        self.d2t, self.t2d = self.model.d2t, self.model.t2d
        self.metrics = checkpoint.MetricsLog(cfg.out, enabled=dist.is_main, truncate_after=self.step)
        from eagle3.devices import resolve_precision

        self.precision = resolve_precision(cfg.precision, dist.device)
        before = (self.ckpt.state.get("precision") or {}).get("name") if self.ckpt is not None else None
        if before not in (None, self.precision.name):
            log.info("resuming a run trained in %s so far in %s (%s); the weights and optimizer are fp32 either way",
                     before, self.precision.name, self.precision.reason)

    # -- plan -----------------------------------------------------------------
    def plan(self, epoch: int) -> list[list[str]]:
        if epoch not in self.plans:
            self.plans[epoch] = data.global_batches(self.inp.train_ids, self.lengths, self.global_tokens,
                                                    self.cfg.seed, epoch)
        return self.plans[epoch]

    def _total_steps(self, capped: bool = True) -> int:
        total = sum(len(self.plan(e)) for e in range(self.cfg.epochs))
        return min(total, self.cfg.max_steps) if self.cfg.max_steps and capped else total

    # -- one micro-batch --------------------------------------------------------
    def _micro(self, ids: list[str], denominators: torch.Tensor, grad: bool):
        maybe_inject(data.padded_tokens(ids, self.lengths))
        batch = data.collate(self.inp.source, ids, self.device)
        shard = None
        if self.seq_parallel:  # the soft labels of this process's window only (the cache keys whole rows)
            shard = SeqShard(self.dist.rank, self.dist.world, batch["input_ids"].shape[1])
            batch = objective.shard_window(batch, shard, self.cfg.ttt_length)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision.bf16):
            with torch.no_grad():
                known = None if shard else self.in_draft.get(ids, batch["input_ids"].shape[1])
                # A budget still timing its first steps learns what the first sight of a sample costs (the
                # full-vocab in-draft mask) apart from the rest: later epochs read the cache instead (CPU only:
                # timing a CUDA stream here would need a sync).
                t_labels = perf_counter() if known is None and shard is None and self._probing(grad) else None
                target_logits, in_draft = objective.targets(batch, self.head, self.d2t, self.t2d,
                                                            None if known is None else known.to(self.device))
                if known is None and shard is None:
                    self.in_draft.put(ids, in_draft, batch["attention_mask"])
                if t_labels is not None:
                    self.budget.record_first_sight(perf_counter() - t_labels)
            with torch.set_grad_enabled(grad):
                res = objective.ttt_sums(self.model, batch, target_logits, in_draft, denominators.to(self.device),
                                         self.cfg.ttt_length, compiled=self.cfg.compile,
                                         checkpoint_steps=self.cfg.checkpoint_ttt_steps, shard=shard,
                                         sparse=self.cfg.sparse_steps)
        if grad:
            res.loss.backward()
        return res

    def _run(self, ids: list[str], denominators: torch.Tensor, grad: bool,
             ahead: list[str] = ()) -> tuple[torch.Tensor, bool]:
        """Sums [loss, loss_sums(S), correct(S), counts(S), eligible(S)] over this rank's micro-batches, and an
        OOM flag.
        ``ahead``: this rank's samples of the next step, whose target states an online source may prefetch."""
        s = self.cfg.ttt_length
        sums = torch.zeros(1 + 4 * s, dtype=torch.float64)
        try:
            mbs = list(data.micro_batches(ids, self.lengths, self.micro))
            self.inp.source.schedule(mbs + list(data.micro_batches(list(ahead), self.lengths, self.micro)))
            for mb in mbs:
                res = self._micro(mb, denominators, grad)
                sums += torch.cat([res.loss.detach().reshape(1).double().cpu(), res.loss_sums.double().cpu(),
                                   res.correct.double().cpu(), res.counts.double().cpu(), res.eligible.double().cpu()])
                del res
            return sums, False
        except Exception as e:  # noqa: BLE001 - anything but an OOM is re-raised
            if not is_oom(e):
                raise
            log.warning("out of memory on rank %d with micro-batch %d tokens: %s", self.dist.rank, self.micro, e)
            if self.seq_parallel:
                # The other ranks are inside this micro-batch's collectives (step 0's all_gather) and would never
                # reach the flag's all_reduce: this rank, whose weights and moments are everyone's, saves alone and
                # exits 75; torchrun then stops the others.
                self._on_oom(alone=True)
            return sums, True

    def _denominators(self, batch: list[str]) -> torch.Tensor:
        return objective.step_denominators([self.inp.loss_mask(s) for s in batch], self.cfg.ttt_length)

    def _on_nonfinite(self, grad_norm: float, lr: float) -> None:
        """A step whose gradient norm is NaN/inf: skipped (the weights stay as they were); NONFINITE_LIMIT in a
        row stop the run before a checkpoint could hold them."""
        where = f"step {self.step + 1} (lr {lr:.3g}, epoch {self.pos.epoch}, batch {self.pos.index})"
        if self.nonfinite < NONFINITE_LIMIT:
            log.warning("gradient norm %s at %s: step skipped, weights unchanged", grad_norm, where)
            return
        raise TrainingDiverged(
            f"the gradient norm was NaN/inf for {self.nonfinite} steps in a row, up to {where}: the training "
            f"diverged. The last checkpoint ({checkpoint.latest_step_dir(self.cfg.out) or 'none yet'}) holds "
            "finite weights; lower --lr (or check the data) and train again into a new --out", file=self.cfg.out)

    # -- OOM ----------------------------------------------------------------------
    def _on_oom(self, alone: bool = False) -> None:
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        old = (self.micro, self.accum)
        self.micro, self.accum = halve(self.micro, self.accum, max(self.lengths.values()))
        try:
            self.save(alone=alone)  # the weights are those after the last completed step
        except OSError:
            # alone: another rank ran out of memory on the same micro-batch and saved the same step first
            if not alone or checkpoint.latest_step_dir(self.cfg.out) != storage.join(
                    self.cfg.out, checkpoint.step_dir_name(self.step)):
                raise
        raise GpuOutOfMemory(
            f"out of memory with micro-batch {old[0]} tokens x grad_accum {old[1]} at step {self.step}; saved "
            f"{self.cfg.out} with micro-batch {self.micro} x grad_accum {self.accum} (same effective batch); "
            "re-run the same command to resume"
        )

    # -- checkpoint -----------------------------------------------------------------
    def save(self, alone: bool = False) -> None:
        """Rank 0 writes, the others wait; ``alone``: this rank writes and nobody waits (sequence parallelism's
        OOM, where every rank holds the same weights and moments and the others are stuck in a collective)."""
        if self.dist.is_main or alone:
            tensors, opt_meta = ckpt_state.optimizer_tensors(self.opt, self.names)
            state = {
                # token_budget (padded tokens per micro-batch) and grad_accum are what the OOM path adapts.
                "position": self.pos.to_dict(), "epoch": self.pos.epoch,
                "token_budget": self.micro, "grad_accum": self.accum,
                "global_tokens": self.global_tokens, "world_size": self.dist.world, "optimizer": opt_meta,
                "rng": ckpt_state.rng_state(), "total_steps": self.total_steps,
                "lr": self._lr(max(self.step - 1, 0)),
                "schedule": {"kind": "cosine", "warmup_ratio": self.cfg.warmup_ratio,
                             "min_lr_ratio": self.cfg.min_lr_ratio, "peak_lr": self.cfg.lr},
                "budget": self.budget.to_dict() if self.budget is not None else None,
                "train_config": {k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__},
                "precision": self.precision.to_dict(),
            }
            checkpoint.save(self.cfg.out, self.step, self.model.state_dict(), tensors, state,
                            self.model.config.to_dict(), keep=self.cfg.keep)
            self.metrics.flush()
        if not alone:
            self.dist.barrier()

    def _lr(self, step: int) -> float:
        if self.budget is None:
            return lr_at(step, self.total_steps, self.cfg)
        point, total = self.budget.schedule_point(step, self.total_steps)
        return lr_at(point, total, self.cfg, self.budget.warmup)

    def _probing(self, grad: bool) -> bool:
        return grad and self.budget is not None and not self.budget.fixed and self.device.type == "cpu"

    def _fix_budget(self, elapsed: float) -> None:
        """After the timed first steps, and again (`TimeBudget.refit`) after the first steps of the kind that fill
        the rest of the run: total_steps = the steps that fit in the rest of the budget."""
        heldout = sum(self.lengths[s] for s in self.inp.heldout_ids)
        checking, was = self.budget.refitted, self.total_steps  # after the refit: a check of the plan
        if self.budget.fixed:
            mine = self.budget.refit(self.step, elapsed, self._future_tokens(), heldout)
        else:
            # One process, whole rows: from the second epoch on every sample's in-draft mask is cached. (Several
            # data-parallel processes see other samples each epoch; their steps are all planned at one rate.)
            cached_from = None
            if self.dist.world == 1 and self.device.type == "cpu":
                cached_from = max(len(self.plan(0)) - self.pos.index, 0) if self.pos.epoch == 0 else 0
            mine = self.budget.fix(self.step, elapsed, self._future_tokens(), heldout, cached_from=cached_from)
        least = -self.dist.all_reduce(torch.tensor([-float(mine)], dtype=torch.float64), op="max").item()
        self.budget.agree(int(least))
        self.total_steps = self.budget.total_steps
        if not checking or self.total_steps != was:
            log.info("time budget %.0f s: %s", self.budget.seconds, self.budget.describe())

    def _log_step(self, sums, lr: float, grad_norm: float, tokens: int, tokens_per_s: float, line: str) -> None:
        """The step's metrics row and log line (every log_every steps, and the last)."""
        m = self._metrics(sums, loss=float(sums[0]))
        m.update(event="train", step=self.step, epoch=self.pos.epoch, lr=lr, grad_norm=grad_norm, tokens=tokens,
                 tokens_per_s=tokens_per_s, token_budget=self.micro, grad_accum=self.accum,
                 world_size=self.dist.world, precision=self.precision.name, **self._mode())
        self.metrics.write(m)
        log.info("step %d/%d loss %.4f acc_0 %.3f lr %.2e | %s", self.step, self.total_steps, m["loss"],
                 m["acc_0"], lr, line)

    def _budget_due(self) -> bool:
        """Whether the budget fixes or checks its total now; with several processes, whether any does (the
        refit's share of seconds is each rank's own clock; the step count, and so the call, must be one)."""
        if self.budget is None or self.budget.replayed:  # (the same on every rank)
            return False
        due = self.budget.due(self.step) or self.budget.refit_due(self.step)
        if self.dist.world > 1:
            due = bool(self.dist.all_reduce(torch.tensor([float(due)]), op="max").item())
        return due

    def _future_batches(self):
        """Each step's global batch from the current position on, over as many epochs as it takes."""
        epoch, index = self.pos.epoch, self.pos.index
        while True:
            batches = self.plan(epoch)
            yield from batches[index:]
            epoch, index = epoch + 1, 0
            if not batches:
                return

    def _past_batches(self) -> list:
        """Each step's global batch before the current position."""
        return [b for e in range(self.pos.epoch) for b in self.plan(e)] + self.plan(self.pos.epoch)[:self.pos.index]

    def _future_tokens(self):
        """Real tokens of each step from the current position on."""
        return (sum(self.lengths[s] for s in b) for b in self._future_batches())

    # -- evaluation ------------------------------------------------------------------
    def evaluate(self) -> dict | None:
        held = self.inp.heldout_ids
        if not held:
            return None
        self.model.eval()
        mine = data.rank_slice(held, self.lengths, self.data_rank, self.data_world)
        sums, failed = self._run(mine, torch.ones(self.cfg.ttt_length), grad=False)
        self.model.train()
        self._flush_online()  # the next evaluation reads the held-out samples written back
        if self.dist.all_reduce(torch.tensor([float(failed)]), op="max").item():
            self._on_oom()
        self.dist.all_reduce(sums)
        m = self._metrics(sums, loss=None)
        m.update(event="eval", step=self.step, heldout_samples=len(held),
                 heldout_tokens=sum(self.lengths[s] for s in held))
        self.metrics.write(m)
        log.info("eval step %d: simulated acceptance length %.3f, acc %s", self.step, m["sim_accept_len"],
                 " ".join(f"{a:.3f}" for a in m["acc_i"]))
        return m

    def _metrics(self, sums: torch.Tensor, loss: float | None) -> dict:
        from eagle3.draft.config import DEFAULT_STEP_DECAY
        from eagle3.draft.ttt import metrics_from_sums

        s = self.cfg.ttt_length
        m = metrics_from_sums(float(sums[0]) if loss is None else loss, sums[1:1 + s], sums[1 + s:1 + 2 * s],
                              sums[1 + 2 * s:1 + 3 * s], sums[1 + 3 * s:])
        # "loss": sum_i decay^i * loss_i (per-step means over trained positions), comparable between train
        # and eval; "objective": what the optimizer minimized (global denominators, see objective.py).
        m["objective"] = m["loss"]
        m["loss"] = sum(DEFAULT_STEP_DECAY ** i * m[f"loss_{i}"] for i in range(s))
        m["loss_i"] = [m[f"loss_{i}"] for i in range(s)]
        m["acc_i"] = [m[f"acc_{i}"] for i in range(s)]
        m["in_vocab_i"] = [m[f"in_vocab_{i}"] for i in range(s)]
        return m

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> dict:
        cfg, dist = self.cfg, self.dist
        if self.budget is not None and self.budget.fixed:  # a budget's count runs past ``epochs``
            todo = list(itertools.islice(self._future_batches(), max(self.total_steps - self.step, 0)))
            done = self._past_batches()
        else:
            batches = [b for e in range(cfg.epochs) for b in self.plan(e)]
            todo, done = batches[self.step: self.total_steps], batches[:self.step]
        # A resumed run (an OOM retry, a killed task) names what its earlier attempts trained.
        progress = Progress("train", total_samples=sum(map(len, todo)),
                            total_tokens=sum(self.lengths[s] for b in todo for s in b),
                            kept=sum(map(len, done)) if self.step else 0)
        run_tokens, t0 = 0, time.monotonic()
        # The budget's clock: this process's seconds after those of the processes before it (a resume).
        clock0 = self.budget.spent if self.budget is not None and not self.budget.replayed else 0.0
        last_eval = None
        if self.ckpt is not None and self.step >= self.total_steps and (self.budget is None or self.budget.fixed):
            # A finished run started again (e.g. a re-triggered task): nothing to train, no duplicate lines.
            evals = checkpoint.read_metrics(self.metrics.uri, "eval") if dist.is_main else []
            # An out-of-memory in the final held-out evaluation saved this step and stopped: evaluate it now
            # (rank 0 reads the metrics; every rank joins the evaluation).
            missing = dist.is_main and not (evals and evals[-1].get("step") == self.total_steps)
            if self.inp.heldout_ids and dist.all_reduce(torch.tensor([float(missing)]), op="max").item():
                log.info("%s is at step %d of %d without its final held-out evaluation: evaluating", cfg.out,
                         self.step, self.total_steps)
                last_eval = self.evaluate()
                self._flush_online()
                return self._summary(last_eval, 0, 0.0)
            log.info("%s is already at step %d of %d; nothing to do", cfg.out, self.step, self.total_steps)
            return self._summary(evals[-1] if evals else None, 0, 0.0)
        log.info("training %d steps (from step %d), %d train / %d held-out samples, micro-batch %d tokens x "
                 "grad_accum %d x %d process(es), %d tokens per step, %s compute (%s)", self.total_steps, self.step,
                 len(self.inp.train_ids), len(self.inp.heldout_ids), self.micro, self.accum, dist.world,
                 self.global_tokens, self.precision.name, self.precision.reason)
        last, logged = None, -1  # the step just taken (for its line if a re-plan ends the run there), the last logged
        while self.step < self.total_steps or (self.budget is not None and not self.budget.fixed):
            if self._budget_due():
                self._fix_budget(clock0 + time.monotonic() - t0)
                planned = list(itertools.islice(self._future_batches(), max(self.total_steps - self.step, 0)))
                progress.total_tokens = max(progress.tokens + sum(self.lengths[s] for b in planned for s in b), 1)
                progress.total_samples = progress.samples + sum(map(len, planned))  # samples seen, epochs included
                if self.step >= self.total_steps:
                    if last is not None and logged != self.step:  # a re-plan ended the run at this step
                        self._log_step(*last, run_tokens / max(time.monotonic() - t0, 1e-9), progress.line())
                    break
            batches = self.plan(self.pos.epoch)
            if self.pos.index >= len(batches):
                self.pos = data.Position(self.pos.epoch + 1, 0)
                self._flush_online()  # the next epoch reads the written-back samples
                continue
            gb = batches[self.pos.index]
            denominators = self._denominators(gb)
            mine = data.rank_slice(gb, self.lengths, self.data_rank, self.data_world)
            self.opt.zero_grad(set_to_none=True)
            sums, failed = self._run(mine, denominators, grad=True, ahead=self._next_slice())
            if dist.all_reduce(torch.tensor([float(failed)]), op="max").item():
                self._on_oom()
            dist.all_reduce_grads(self.params)
            dist.all_reduce(sums)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip))
            lr = self._lr(self.step)
            for g in self.opt.param_groups:
                g["lr"] = lr
            if math.isfinite(grad_norm):
                self.nonfinite = 0
                self.opt.step()
            else:  # every rank sees the same reduced norm, so all skip together
                self.nonfinite += 1
                self._on_nonfinite(grad_norm, lr)
            self.step += 1
            self.pos = data.Position(self.pos.epoch, self.pos.index + 1)
            tokens = sum(self.lengths[s] for s in gb)
            if self.budget is not None:
                self.budget.record(self.step, tokens, clock0 + time.monotonic() - t0)
            run_tokens += tokens
            progress.update(samples=len(gb), tokens=tokens)
            last = (sums, lr, grad_norm, tokens)
            if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                self._log_step(*last, run_tokens / max(time.monotonic() - t0, 1e-9), progress.line())
                logged = self.step
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                timing = self.budget is not None and self.budget.timing
                t_eval = time.monotonic() if timing else 0.0
                last_eval = self.evaluate()
                if timing:  # the refit plans evaluations at their measured cost, apart from the steps'
                    self.budget.record_eval(time.monotonic() - t_eval)
            if self.step % cfg.save_every == 0 and self.step < self.total_steps:
                self.save()
        last_eval = self.evaluate() or last_eval
        self._flush_online()
        self.save()
        progress.finish()
        return self._summary(last_eval, run_tokens, time.monotonic() - t0)

    def _summary(self, last_eval: dict | None, run_tokens: int, elapsed: float) -> dict:
        return {
            "checkpoint": checkpoint.latest_step_dir(self.cfg.out), "steps": self.step, "total_steps": self.total_steps,
            "tokens": run_tokens, "tokens_per_s": run_tokens / max(elapsed, 1e-9), "seconds": elapsed,
            "sim_accept_len": last_eval["sim_accept_len"] if last_eval else None,
            "heldout_acc": last_eval["acc_i"] if last_eval else None,
            "token_budget": self.micro, "grad_accum": self.accum, "world_size": self.dist.world,
            "epoch": self.pos.epoch, "precision": self.precision.to_dict(),
            "budget": self.budget.to_dict() if self.budget is not None else None,
            "metrics": self.metrics.uri, **self._mode(),
            # what ran the target for the trained samples (a draft on vLLM's states vs on transformers')
            "engines": self.inp.source.engines(self.inp.train_ids),
        }

    # -- online mode (eagle3.train.online) -------------------------------------------------
    def _next_slice(self) -> list[str]:
        """This rank's samples of the step after the current one (in this epoch), for an online prefetch."""
        if self.step + 1 >= self.total_steps:
            return []
        batches = self.plan(self.pos.epoch)
        if self.pos.index + 1 >= len(batches):
            return []
        return data.rank_slice(batches[self.pos.index + 1], self.lengths, self.data_rank, self.data_world)

    def _mode(self) -> dict:
        """"mode" for the metrics and the summary; online runs add what the target computed so far."""
        stats = self.inp.source.stats()
        return {"mode": self.inp.source.mode, **({"online": stats} if stats is not None else {})}

    def _flush_online(self) -> None:
        self.inp.source.flush()
