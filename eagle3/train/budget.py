"""A training time budget: time the first optimizer steps, then fix the step count that fits.

`TrainConfig.train_time_budget` seconds. The run trains with a provisional schedule while it times
BUDGET_PROBE_STEPS steps (the first step of a process is not timed: it pays one-time set-up). Then
`fix` walks the plan's next global batches (over as many epochs as needed) at the measured tokens/s,
adding each held-out evaluation the schedule will run (a forward only: a third of a training step's
cost per token) and the final one, and stops where the budget ends: that is `total_steps`, and with
it the cosine schedule. The warm-up length is fixed at the start (from the epochs-based step count,
and at least the steps run before the total is known), so those steps ran at the learning rate the
fixed schedule gives them.

The budget, its measurement, the fixed total and the seconds spent are saved in the checkpoint
(`train_state.json` "budget"); a resumed run, or the retry after an out-of-memory, keeps that total and so
the same schedule, and its clock goes on from the seconds spent: the checks below re-plan it only where the
rest of the run, at the speed it now runs at, would miss the budget's end. A run killed before the total
was fixed times again.

Four steps price the rest of a run roughly: on one CPU process the steps after the first epoch read every
sample's in-draft mask from a cache, and `fix` prices them from the share of the timed seconds the masks took,
which over- or underestimates them by up to a quarter (a demo planned 315 s and ran 393). So once
BUDGET_REFIT_STEPS steps and BUDGET_REFIT_SHARE of the budget of the kind that fills the rest of the run (after
the first epoch where it caches, else any; the first epoch's when it is most of the run left, the cached
steps after it then priced at the first fix's ratio) have been timed, `refit` fixes the total a second time at
their measured rate, evaluations at their measured cost. The rest of the first fix's cosine then runs over the
steps left (`schedule_point`): no jump in the learning rate at the refit (re-evaluating the cosine at the new
total would have dropped it from 0.83 to 0.66 of the peak in a demo). After the refit every window of as many
steps checks the plan again at those steps' speed, and re-plans (`measured["replans"]`, the cosine squeezed or
stretched once more) only where its end would miss the budget's by more than BUDGET_DRIFT of it in two checks
in a row, or 3x that in one: load that came after the refit let a demo's 169-s budget run 224 s. A run resumed
before the refit times its own steps for it (`refit_from` is saved); one resumed after keeps the saved total and
the same curve, and checks it as above.
`TrainConfig.train_deadline` stretches the budget to a wall-clock time (`budget_seconds`); the DAG computes it
from the run's start, `run_time_budget` and `after_train_reserve` (`run_deadline`), the reserve scaled to this
run's measured extraction rate where `reserve_tokens_per_s` says at which rate it was sized (`scaled_reserve`).
Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from itertools import islice, tee
from typing import Iterable

from eagle3.train.config import (BUDGET_DRIFT, BUDGET_PROBE_STEPS, BUDGET_REFIT_SHARE, BUDGET_REFIT_STEPS, TrainConfig,
                                  warmup_length, warmup_steps)

EVAL_COST_PER_TOKEN = 1 / 3  # an evaluation runs the TTT forward only: about a third of a training step


def step_cost(steps: list[tuple[int, float]]) -> tuple[float, float]:
    """(seconds per step, seconds per real token) fitted to timed ``steps`` of (real tokens, seconds) by least
    squares, both >= 0: a step costs more than its tokens (the optimizer, the TTT loop's small ops, padding), so
    pricing by tokens/s alone misjudged a run whose timed steps held more tokens than the rest (a 150-s budget
    ran 173-178 s). All steps of one size (or too few): proportional to tokens."""
    n = len(steps)
    total_t, total_s = sum(t for t, _ in steps), sum(s for _, s in steps)
    proportional = (0.0, total_s / max(total_t, 1e-9))
    if n < 2:
        return proportional
    mean_t, mean_s = total_t / n, total_s / n
    var = sum((t - mean_t) ** 2 for t, _ in steps)
    if var <= 1e-9 * max(mean_t, 1.0) ** 2 * n:
        return proportional
    b = sum((t - mean_t) * (s - mean_s) for t, s in steps) / var
    if b <= 0:  # time does not grow with tokens here: a cost per step
        return mean_s, 0.0
    a = mean_s - b * mean_t
    return (a, b) if a >= 0 else proportional


def run_deadline(run_start: float, run_time_budget: float, after_train_reserve: float) -> float:
    """The UNIX time by which training must end for a run started at ``run_start`` to finish within
    ``run_time_budget`` seconds, ``after_train_reserve`` of them kept for the stages after train (0: no run
    budget, no deadline)."""
    return run_start + run_time_budget - after_train_reserve if run_time_budget > 0 else 0.0


RESERVE_FLOOR = 0.5
"""The share of ``after_train_reserve`` kept however fast this run extracted: a vLLM server's start and the
tasks' start-ups do not speed up with the target's forward."""


def scaled_reserve(reserve: float, sized_at_tokens_per_s: float, measured_tokens_per_s: float | None) -> float:
    """``after_train_reserve`` for this machine: the stages after train (evaluate above all) run the target as
    extraction did, so a reserve sized where extraction ran at ``sized_at_tokens_per_s`` shrinks by that over
    this run's measured rate, to no less than RESERVE_FLOOR of it and never grown (a slower machine keeps the
    reserve as given). Either rate unknown or 0: the reserve as given."""
    if reserve <= 0 or not sized_at_tokens_per_s or not measured_tokens_per_s:
        return reserve
    return reserve * min(1.0, max(RESERVE_FLOOR, sized_at_tokens_per_s / measured_tokens_per_s))


def extraction_rate(results: Iterable[dict]) -> float | None:
    """Target tokens per second of forward over the extract shards' results (their ``tokens`` and
    ``tokens_per_s``), weighted by tokens; None when no shard extracted anything (all reused, or online)."""
    tokens = seconds = 0.0
    for r in results:
        n, rate = r.get("tokens") or 0, r.get("tokens_per_s") or 0
        if n > 0 and rate > 0:
            tokens, seconds = tokens + n, seconds + n / rate
    return tokens / seconds if seconds > 0 else None


def budget_seconds(cfg: TrainConfig, now: float | None = None) -> float:
    """The training loop's time budget when it starts at ``now``: ``train_time_budget``, stretched to
    ``train_deadline`` when that leaves more (0: no budget)."""
    left = cfg.train_deadline - (time.time() if now is None else now) if cfg.train_deadline else 0.0
    return max(float(cfg.train_time_budget), left)


@dataclass
class TimeBudget:
    seconds: float
    """The budget (`budget_seconds`: TrainConfig.train_time_budget, or longer to meet train_deadline)."""
    warmup: int
    """Warm-up steps, set at the start from the epochs-based step count, and shortened by `fix` to warmup_ratio of
    the fixed total when that is less (a short budget would otherwise end inside its warm-up)."""
    max_steps: int = 0
    """TrainConfig.max_steps (0: no cap)."""
    eval_every: int = 0
    """TrainConfig.eval_every: evaluations the plan must leave time for."""
    fixed: bool = False
    """Whether total_steps is known."""
    total_steps: int | None = None
    """The fixed step count."""
    measured: dict = field(default_factory=dict)
    """What fixed it: timed steps, seconds, tokens/s, the elapsed time then, the planned seconds."""
    refit_from: int | None = None
    """The step after which steps are timed for `refit` (None: no refit to come). Saved: a run resumed before
    the refit times its own steps for it, as one resumed before the fix does."""
    cached_at: int | None = None
    """When the refit times first-epoch steps (most of the run left is its first epoch): the first step whose
    samples' in-draft masks are cached; the refit prices those steps at its measured rate times
    ``cached_speedup``, the ratio the first fix measured."""
    cached_speedup: float = 1.0
    replayed: bool = False
    """Another run's schedule (TrainConfig.schedule_from): its total and curve, never timed."""
    warmup_ratio: float = 0.02
    """TrainConfig.warmup_ratio, for `fix`."""
    spent: float = 0.0
    """Seconds into the budget at the last recorded step, this process's and the ones before it (saved): a resumed
    run's clock goes on from its checkpoint's, so a retry trains what is left of the budget, not all of it again."""
    _from: tuple[int, int, float] | None = None  # (step, tokens so far, elapsed) at the first timed step's start
    _tokens: int = 0
    _first_sight: float = 0.0  # seconds of the timed steps spent on first-seen samples' in-draft masks
    _window: tuple[int, float] | None = None  # (step, elapsed) where the timing for the refit or a check began
    _eval_s: list = field(default_factory=list)  # seconds of each evaluation run since the total was fixed
    _eval_in_window: float = 0.0
    _steps: list = field(default_factory=list)  # (real tokens, seconds) of each step timed for the refit
    _eval_pending: float = 0.0  # evaluation seconds inside the next step's interval (not the step's cost)
    _last: float = 0.0  # elapsed at the last `record`
    _check: dict | None = None  # a re-plan `refit` proposed, recorded by `agree` if the ranks' total changes
    _drift: int = 0  # the sign of the last check's drift past BUDGET_DRIFT (0: within it, or just re-planned)
    _shorten_warmup: bool = False  # the first `agree` after `fix` fits the warm-up to the agreed total

    @classmethod
    def start(cls, cfg: TrainConfig, provisional_total: int, now: float | None = None) -> "TimeBudget | None":
        seconds = budget_seconds(cfg, now)
        if seconds <= 0:
            return None
        # The untimed first step and the timed ones all lie inside the warm-up, whose learning rates do not
        # depend on the total: every step runs at the rate the fixed schedule gives it.
        warmup = max(warmup_steps(provisional_total, cfg), BUDGET_PROBE_STEPS + 1)
        return cls(seconds, warmup, cfg.max_steps, cfg.eval_every, warmup_ratio=cfg.warmup_ratio)

    @classmethod
    def resume(cls, state: dict, cfg: TrainConfig, now: float | None = None) -> "TimeBudget | None":
        """The checkpoint's budget (None when the run was not budgeted: its schedule stays epochs-based). Its clock
        goes on from ``spent``; with a ``train_deadline`` the budget also ends by then (a retry that waited for a
        device must not run past the run's deadline), never below ``train_time_budget``."""
        saved = state.get("budget")
        if not saved:
            return None
        saved = {"warmup_ratio": cfg.warmup_ratio, **saved}  # a checkpoint of an older release has none
        budget = cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__ and not k.startswith("_")})
        budget._last = budget.spent
        if cfg.train_deadline and not budget.replayed:
            left = cfg.train_deadline - (time.time() if now is None else now)
            budget.seconds = min(budget.seconds, max(float(cfg.train_time_budget), budget.spent + max(left, 0.0)))
        return budget

    @classmethod
    def replay(cls, ckpt_dir: str) -> "TimeBudget":
        """The fixed schedule of the time-budgeted run whose checkpoint folder is ``ckpt_dir`` (its latest step),
        to be trained again untimed (TrainConfig.schedule_from)."""
        from eagle3 import checkpoint, storage
        from eagle3.errors import InputError

        step_dir = checkpoint.latest_step_dir(ckpt_dir)
        if step_dir is None:
            raise InputError(f"schedule_from={ckpt_dir}: no checkpoint there (latest.json); pass the CKPT folder of "
                             "a finished time-budgeted eagle3 train run")
        path = storage.join(step_dir, checkpoint.STATE_FILE)
        state = storage.read_json(path)
        saved = state.get("budget") or {}
        if not saved.get("fixed"):
            raise InputError(f"{path}: that run had no time budget or stopped before it fixed its step count "
                             "(\"budget\".fixed); schedule_from needs a time-budgeted run's fixed schedule "
                             "(or train with --max-steps instead)")
        budget = cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__ and not k.startswith("_")})
        budget.replayed, budget.refit_from = True, None
        return budget

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    # -- timing -------------------------------------------------------------------------------
    def record(self, step: int, tokens: int, elapsed: float) -> None:
        """After optimizer step ``step`` (1-based) of ``tokens`` real tokens, at ``elapsed`` s into the run."""
        last, self._last = self._last, elapsed
        self.spent = elapsed
        if self.replayed:
            return
        if self.fixed:
            if self.refit_from is not None and step >= self.refit_from or self.refitted:
                if self._window is None:  # timing starts when this step ends (a resumed process's first step
                    self._restart(step, elapsed)  # pays set-up: not timed either)
                else:
                    self._steps.append((tokens, max(elapsed - last - self._eval_pending, 0.0)))
                    if self.refitted and step == self.cached_at:  # the first epoch ends: time cached steps alone
                        self._restart(step, elapsed)
            self._eval_pending = 0.0
            return
        if self._from is None:  # this process's first step: set-up, not timed
            self._from = (step, 0, elapsed)
            return
        self._tokens += tokens

    @property
    def refitted(self) -> bool:
        """Whether the refit ran: from then on `record` times windows of steps for the checks of the plan."""
        return "refit" in self.measured

    @property
    def timing(self) -> bool:
        """Whether evaluations are timed apart (`record_eval`): while steps are timed for a refit or a check."""
        return self.fixed and (self.refit_from is not None or self.refitted)

    def _restart(self, step: int, elapsed: float) -> None:
        self._window, self._steps, self._eval_in_window = (step, elapsed), [], 0.0

    def record_eval(self, seconds: float) -> None:
        """Seconds a held-out evaluation took (after the total was fixed): `refit` plans evaluations at this cost
        and does not count it as training time."""
        if self.fixed:
            self._eval_s.append(seconds)
            if self._window is not None:
                self._eval_in_window += seconds
                self._eval_pending += seconds

    def record_first_sight(self, seconds: float) -> None:
        """Seconds of a timed step spent on what only a sample's first micro-batch computes (the in-draft mask,
        eagle3/train/objective.py InDraftCache), so that `fix` can price the steps that read it from the cache."""
        if not self.fixed and self._from is not None:
            self._first_sight += seconds

    def due(self, step: int) -> bool:
        """Whether enough steps were timed to fix the total, or max_steps ends the run before they were."""
        if self.fixed:
            return False
        if self.max_steps and step >= self.max_steps:
            return True
        return self._from is not None and step - self._from[0] >= BUDGET_PROBE_STEPS

    def fix(self, step: int, elapsed: float, future_tokens: Iterable[int], heldout_tokens: int,
            cached_from: int | None = None) -> int:
        """Fix total_steps: ``step`` done after ``elapsed`` s; ``future_tokens`` the real tokens of each next step.

        ``cached_from``: the next steps from this index on see only samples seen before, so they cost the timed
        seconds less those of first sights (`record_first_sight`) per token; None: every step as the timed ones."""
        start = self._from if self._from is not None else (step, 0, elapsed)  # capped before any timed step
        timed_s = max(elapsed - start[2], 1e-9)
        rate = self._tokens / timed_s  # real tokens per second
        seen_s = min(self._first_sight, 0.9 * timed_s)  # a clock that disagrees cannot price a step at ~0 s
        rate_seen = self._tokens / (timed_s - seen_s) if cached_from is not None else rate
        eval_s = heldout_tokens * EVAL_COST_PER_TOKEN / max(rate, 1e-9)
        left = self.seconds - elapsed - eval_s  # the final evaluation always runs
        n, planned = self._walk(step, future_tokens, left, eval_s, lambda i, tokens: tokens / max(
            rate_seen if cached_from is not None and i >= cached_from else rate, 1e-9))
        self.total_steps, self.fixed = step + n, True
        self._shorten_warmup = True  # by `agree`, at the total every rank takes
        refit_from = step + (cached_from or 0)
        if cached_from and 2 * cached_from >= n:
            # Most of the run left is its first epoch (a short budget): time those steps, and price the cached
            # ones after them at the ratio measured here (a demo's 150-s budget ran 177 s refitting only those).
            refit_from, self.cached_at, self.cached_speedup = step, step + cached_from, rate_seen / max(rate, 1e-9)
        self.refit_from = refit_from if refit_from + BUDGET_REFIT_STEPS < self.total_steps else None
        if self.refit_from == step:  # this step just ended: the refit's timing starts now
            self._window = (step, elapsed)
        self.measured = {"timed_steps": step - start[0], "timed_seconds": round(timed_s, 3),
                         "tokens_per_s": round(rate, 1), "first_sight_seconds": round(seen_s, 3),
                         "tokens_per_s_seen": round(rate_seen, 1), "fixed_at_step": step,
                         "elapsed_s": round(elapsed, 3), "planned_seconds": round(planned + eval_s, 3)}
        return self.total_steps

    def _walk(self, step: int, future_tokens: Iterable[int], left: float, eval_s: float, cost) -> tuple[int, float]:
        """(steps, seconds) of the plan's next steps that fit in ``left`` seconds: ``cost(i, tokens)`` prices the
        i-th, an evaluation of ``eval_s`` follows every eval_every-th; max_steps caps."""
        planned, n = 0.0, 0
        for tokens in future_tokens:
            if self.max_steps and step + n >= self.max_steps:
                break
            c = cost(n, tokens) + (eval_s if self.eval_every and (step + n + 1) % self.eval_every == 0 else 0.0)
            if planned + c > left:
                break
            planned += c
            n += 1
        return n, planned

    def refit_due(self, step: int) -> bool:
        """Whether the steps timed by the last `record` are enough for `refit`: the refit, then each check."""
        return ((self.refit_from is not None or self.refitted) and self._window is not None and not self.replayed
                and step - self._window[0] >= BUDGET_REFIT_STEPS and step < (self.total_steps or 0)
                and self._last - self._window[1] - self._eval_in_window >= BUDGET_REFIT_SHARE * self.seconds)

    def refit(self, step: int, elapsed: float, future_tokens: Iterable[int], heldout_tokens: int) -> int:
        """Fix total_steps again at the cost of the steps timed since `fix` (all of the kind the rest of the run
        is: see the module doc), evaluations at their measured cost. After that first refit, a check: the total
        it returns differs only where the current plan would end further than BUDGET_DRIFT of the budget from
        its end at the latest window's speed (`agree` records the re-plan)."""
        if self._window is None or not self._steps:  # nothing timed here (a rank told to follow the others): it
            what = {"at_step": step, "timed_steps": 0, "timed_seconds": 0.0, "tokens_per_s": 0.0,  # records what
                    "seconds_per_step": 0.0, "seconds_per_token": 0.0, "eval_seconds": 0.0,  # they record
                    "elapsed_s": round(elapsed, 3), "was_total": self.total_steps}
            if self.refitted:
                self._check = {**what, "projected_seconds": 0.0}
            else:
                self.refit_from, self.measured["refit"] = None, {**what, "planned_seconds": 0.0}
            self._restart(step, elapsed)
            return self.total_steps
        first, began = self._window
        timed_s = max(elapsed - began - self._eval_in_window, 1e-9)
        rate = sum(t for t, _ in self._steps) / timed_s
        eval_s = (sum(self._eval_s) / len(self._eval_s) if self._eval_s
                  else heldout_tokens * EVAL_COST_PER_TOKEN / max(rate, 1e-9))
        fixed_s, per_token = step_cost(self._steps)
        # The refit's cached steps run cached_speedup as fast as its first-epoch ones; a window of cached steps
        # prices them as timed.
        speedup = 1.0 if self.cached_at is not None and first >= self.cached_at else self.cached_speedup

        def cost(i: int, tokens: int) -> float:
            cached = self.cached_at is not None and step + i >= self.cached_at
            return (fixed_s + per_token * tokens) / (speedup if cached else 1.0)

        left = self.seconds - elapsed - eval_s
        what = {"at_step": step, "timed_steps": step - first, "timed_seconds": round(timed_s, 3),
                "tokens_per_s": round(rate, 1), "seconds_per_step": round(fixed_s, 4),
                "seconds_per_token": float(f"{per_token:.4g}"), "eval_seconds": round(eval_s, 3),
                "elapsed_s": round(elapsed, 3), "was_total": self.total_steps}
        self._restart(step, elapsed)
        if not self.refitted:
            n, planned = self._walk(step, future_tokens, left, eval_s, cost)
            self.refit_from = None
            self.measured["refit"] = {**what, "planned_seconds": round(planned + eval_s, 3)}
            self.total_steps = step + n
            return self.total_steps
        mine, ours = tee(future_tokens)
        _, planned = self._walk(step, islice(mine, max(self.total_steps - step, 0)), float("inf"), eval_s, cost)
        self._check = {**what, "projected_seconds": round(elapsed + planned + eval_s, 3)}
        drift = (planned - left) / self.seconds
        sign = (drift > BUDGET_DRIFT) - (drift < -BUDGET_DRIFT)
        # Windows differ by their batches (a demo's read 1,376 then 1,567 tok/s): re-plan on a drift seen twice in
        # a row, or on one of 3x BUDGET_DRIFT at once (load that came).
        if sign == 0 or (sign != self._drift and abs(drift) <= 3 * BUDGET_DRIFT):
            self._drift = sign
            return self.total_steps
        self._drift = 0
        n, planned = self._walk(step, ours, left, eval_s, cost)
        self._check["planned_seconds"] = round(planned + eval_s, 3)
        return step + n

    def schedule_point(self, step: int, total: int) -> tuple[float, int]:
        """(step, total) at which to evaluate the cosine for ``step`` of a run of ``total`` steps: after a refit
        the first fix's cosine, from the refit on, stretched or squeezed over the steps left; else as given."""
        for r in reversed([self.measured["refit"], *self.measured.get("replans", [])] if self.refitted else []):
            # Latest first: each re-plan maps its steps onto the curve of the total it replaced.
            pivot, was = max(r["at_step"], self.warmup), r["was_total"]
            maps = total > pivot and was > pivot
            if maps and step >= pivot:
                step = pivot + (step - pivot) * (was - pivot) / (total - pivot)
            if maps or step < pivot:  # (steps before the pivot ran on the curve of ``was``)
                total = was
        return step, total

    def agree(self, total: int) -> None:
        """Every rank takes the smallest total (they time their own steps; the step count must be one). A check's
        new total is recorded as a re-plan on every rank alike."""
        check, self._check = self._check, None
        if check is not None and total != self.total_steps:
            self.measured.setdefault("replans", []).append({**check, "was_total": self.total_steps})
        self.total_steps = total
        if self._shorten_warmup:
            # A budget that fits fewer steps than the epochs-based plan keeps warmup_ratio of them (the steps run so
            # far were on the longer ramp: the rate steps up once, inside the warm-up). At the agreed total, so
            # every rank has the same curve.
            self._shorten_warmup = False
            self.warmup = max(min(self.warmup, warmup_length(total, self.warmup_ratio)), BUDGET_PROBE_STEPS + 1)
        if self.refit_from is not None and self.refit_from + BUDGET_REFIT_STEPS >= total:
            self.refit_from = None  # too short a run left for a refit (on every rank alike: the agreed total)

    def describe(self) -> str:
        m = self.measured
        seen = (f" ({m['tokens_per_s_seen']:.0f} once every sample's in-draft mask is cached)"
                if m.get("tokens_per_s_seen", m["tokens_per_s"]) != m["tokens_per_s"] else "")
        if m.get("replans"):
            r = m["replans"][-1]
            return (f"re-planned at step {r['at_step']} ({r['elapsed_s']:.0f} s in; re-plan {len(m['replans'])}): "
                    f"the last {r['timed_steps']} steps ran at {r['tokens_per_s']:.0f} tok/s, the plan would have "
                    f"ended at {r['projected_seconds']:.0f} s; {self.total_steps} steps in all (was {r['was_total']})")
        if "refit" in m:
            r = m["refit"]
            return (f"refit at step {r['at_step']} ({r['elapsed_s']:.0f} s in): {r['timed_steps']} later steps ran at "
                    f"{r['tokens_per_s']:.0f} tok/s; {self.total_steps} steps in all (was {r['was_total']}; "
                    f"{r['planned_seconds']:.0f} s planned after that, evaluations of {r['eval_seconds']:.1f} s "
                    "included)")
        return (f"{m['timed_steps']} steps timed at {m['tokens_per_s']:.0f} tok/s{seen}; {self.total_steps} steps "
                f"in all (fixed at step {m['fixed_at_step']}, {m['elapsed_s']:.0f} s in; {m['planned_seconds']:.0f} s "
                f"planned after that, evaluations included)")
