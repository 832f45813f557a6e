"""train_time_budget: the step count (and so the LR schedule) is fixed from the speed of the first steps, a faster
machine trains more steps in the same budget, and a resumed run keeps the fixed count and the curve."""

from __future__ import annotations

import copy
import json
import re
import shutil
import types

import pytest
import torch

from eagle3 import checkpoint
from eagle3.checkpoint import read_metrics
from eagle3.errors import InputError
from eagle3.train import budget as budget_mod
from eagle3.train import loop
from eagle3.train.budget import (EVAL_COST_PER_TOKEN, RESERVE_FLOOR, TimeBudget, budget_seconds, extraction_rate,
                                 run_deadline, scaled_reserve, step_cost)
from eagle3.train.config import (BUDGET_DRIFT, BUDGET_PROBE_STEPS, BUDGET_REFIT_SHARE, BUDGET_REFIT_STEPS, TrainConfig,
                                 lr_at)
from tests.train.test_loop import cfg_for, losses

pytestmark = pytest.mark.precision  # the numbers follow the precision policy (make test forces both)


def test_a_deadline_stretches_the_budget_never_shortens_it_hand_computed():
    # A run started at t=1000 with 840 s for the whole run and 270 s kept after train must end training by 1570.
    assert run_deadline(1000.0, 840.0, 270.0) == 1570.0
    assert run_deadline(1000.0, 0.0, 270.0) == 0.0  # no run budget, no deadline

    def budget(time_budget: float, deadline: float, now: float) -> float:
        cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=time_budget, train_deadline=deadline)
        return budget_seconds(cfg, now)

    assert budget(150, 1570.0, now=1200.0) == 370.0  # earlier stages were quick: 370 s left, more than 150
    assert budget(150, 1570.0, now=1500.0) == 150.0  # slow ones: the floor
    assert budget(150, 1570.0, now=2000.0) == 150.0  # past the deadline (a re-run days later): the floor
    assert budget(150, 0.0, now=1200.0) == 150.0  # no deadline
    assert budget(0, 1570.0, now=1200.0) == 370.0  # a deadline alone budgets the run
    assert budget(0, 0.0, now=1200.0) == 0.0  # neither: epochs decide
    cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=150, train_deadline=1570.0, warmup_ratio=0.1)
    assert TimeBudget.start(cfg, provisional_total=80, now=1200.0).seconds == 370.0
    assert TimeBudget.start(TrainConfig(store="s", vocab="v", out="o", train_deadline=900.0), 80, now=1200.0) is None
    with pytest.raises(InputError, match="train_deadline"):
        TrainConfig(store="s", vocab="v", out="o", train_deadline=-1.0)


def test_the_reserve_shrinks_with_the_measured_extraction_rate_hand_computed():
    """Session 18's demo: shards of 35,305 tokens at 979.7 tok/s and 37,743 at 976.3 -> 978.0 tok/s overall;
    a 270-s reserve sized at 750 tok/s keeps 270 * 750 / 978.0 = 207.1 s (evaluate, publish and report took 175)."""
    shards = [{"tokens": 35305, "tokens_per_s": 979.7}, {"tokens": 37743, "tokens_per_s": 976.3}]
    rate = extraction_rate(shards)
    assert rate == pytest.approx((35305 + 37743) / (35305 / 979.7 + 37743 / 976.3))
    assert rate == pytest.approx(977.9, abs=0.1)
    assert scaled_reserve(270, 750, rate) == pytest.approx(207.1, abs=0.1)
    # a shard that reused everything (no tokens, no rate) weighs nothing; none that extracted: no rate
    assert extraction_rate([*shards, {"tokens": 0, "tokens_per_s": None}]) == pytest.approx(rate)
    assert extraction_rate([{"tokens": 0, "tokens_per_s": None}, {}]) is None and extraction_rate([]) is None
    assert scaled_reserve(270, 750, 4000) == 270 * RESERVE_FLOOR == 135  # a GPU: never below the floor
    assert scaled_reserve(270, 750, 600) == 270  # a slower machine: the reserve as given, never grown
    assert scaled_reserve(270, 0, 978) == scaled_reserve(270, 750, None) == 270  # unsized or unmeasured
    assert scaled_reserve(0, 750, 978) == 0


def test_steps_that_read_cached_masks_are_priced_without_first_sights_hand_computed():
    cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=100.0, eval_every=3, warmup_ratio=0.1)
    b = TimeBudget.start(cfg, provisional_total=80)
    b.record_first_sight(9.0)  # during the untimed first step: not counted
    b.record(1, 500, 7.0)
    for step in range(2, 2 + BUDGET_PROBE_STEPS):
        b.record_first_sight(1.25)  # half of each timed step's 2.5 s: the first sight of its samples
        b.record(step, 250, 7.0 + 2.5 * (step - 1))
    # 100 tok/s as timed, 200 once cached; an evaluation costs 1 s (at the timed rate), 82 s left as above.
    # Two more first-epoch steps of 1,000 tokens at 10 s (step 6 plus its evaluation: 11), then 5 s each (+1 at
    # steps 9, 12, 15, 18): 11, 21, 26, 32, 37, 42, 48, 53, 58, 64, 69, 74, 80; step 19 would end at 85 > 82.
    total = b.fix(1 + BUDGET_PROBE_STEPS, 17.0, iter([1000] * 100), heldout_tokens=300, cached_from=2)
    assert total == 5 + 13
    assert b.measured["first_sight_seconds"] == pytest.approx(5.0)
    assert (b.measured["tokens_per_s"], b.measured["tokens_per_s_seen"]) == (pytest.approx(100.0), pytest.approx(200.0))
    assert "200 once every sample's in-draft mask is cached" in b.describe()
    b.record_first_sight(50.0)  # after the fix: ignored
    assert b.measured["first_sight_seconds"] == pytest.approx(5.0)
    # Without cached_from (several processes) every step is priced as timed: the first test's 7 steps.
    again = TimeBudget.start(cfg, provisional_total=80)
    again.record(1, 500, 7.0)
    for step in range(2, 2 + BUDGET_PROBE_STEPS):
        again.record_first_sight(1.25)
        again.record(step, 250, 7.0 + 2.5 * (step - 1))
    assert again.fix(1 + BUDGET_PROBE_STEPS, 17.0, iter([1000] * 100), heldout_tokens=300) == 5 + 7


def test_fix_walks_the_plan_at_the_measured_speed_hand_computed():
    cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=100.0, eval_every=3, warmup_ratio=0.1)
    b = TimeBudget.start(cfg, provisional_total=80)
    assert b.warmup == 8 and not b.fixed
    assert TimeBudget.start(cfg, provisional_total=10).warmup == BUDGET_PROBE_STEPS + 1  # covers the timed steps
    b.record(1, 500, 7.0)  # the first step pays set-up: not timed
    for step in range(2, 2 + BUDGET_PROBE_STEPS):
        assert not b.due(step - 1)
        b.record(step, 250, 7.0 + 2.5 * (step - 1))  # 250 tokens in 2.5 s: 100 tok/s
    step = 1 + BUDGET_PROBE_STEPS
    assert b.due(step)
    elapsed = 7.0 + 2.5 * BUDGET_PROBE_STEPS  # 17 s
    # 100 tok/s; held-out 300 tokens -> an evaluation costs 300 / 3 / 100 = 1 s (the last one always runs).
    # 100 - 17 - 1 = 82 s left. Next steps of 1,000 tokens cost 10 s each, 11 at steps 6, 9, 12 (an evaluation
    # follows): steps 6..12 take 11+10+10+11+10+10+11 = 73 s; step 13 would end at 83 > 82 -> 7 steps fit.
    total = b.fix(step, elapsed, iter([1000] * 100), heldout_tokens=300)
    assert EVAL_COST_PER_TOKEN == pytest.approx(1 / 3)
    assert (total, b.total_steps, b.fixed) == (5 + 7, 12, True)
    assert b.measured["tokens_per_s"] == pytest.approx(100.0)
    again = TimeBudget.resume({"budget": b.to_dict()}, cfg)
    b.agree(total)  # the ranks' smallest total (one rank here): the warm-up shrinks to 10% of the 12 steps, never
    again = TimeBudget.resume({"budget": b.to_dict()}, cfg)  # below the untimed first step + the 4 timed ones
    assert (again.fixed, again.total_steps, again.warmup) == (True, 12, BUDGET_PROBE_STEPS + 1)
    assert TimeBudget.resume({}, cfg) is None  # a checkpoint of an unbudgeted run keeps its schedule
    capped = TimeBudget.start(TrainConfig(store="s", vocab="v", out="o", train_time_budget=1e6, max_steps=9), 40)
    capped.record(1, 10, 0.0)
    capped.record(2, 10, 1.0)
    assert capped.fix(2, 1.0, iter([10] * 100), 0) == 9  # max_steps still caps
    with pytest.raises(InputError, match="train_time_budget"):
        TrainConfig(store="s", vocab="v", out="o", train_time_budget=-1)


class _Clock:
    """A monotonic clock that advances ``dt`` per reading: the loop reads it a fixed number of times per step,
    so ``dt`` plays the machine's speed."""

    def __init__(self, dt: float):
        self.now, self.dt = 0.0, dt

    def monotonic(self) -> float:
        self.now += self.dt
        return self.now


def _budget_run(monkeypatch, tiny_store, out, dt: float, budget: float = 10.0, **kw):
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=_Clock(dt).monotonic))
    return loop.train(cfg_for(tiny_store, out, token_budget=64, train_time_budget=budget, epochs=1, **kw))


def test_a_faster_machine_trains_more_steps_in_the_same_budget(monkeypatch, tiny_store, tmp_path):
    torch.set_num_threads(1)
    slow = _budget_run(monkeypatch, tiny_store, tmp_path / "slow", dt=0.5)
    fast = _budget_run(monkeypatch, tiny_store, tmp_path / "fast", dt=0.125)
    assert slow["budget"]["fixed"] and fast["budget"]["fixed"]
    assert slow["steps"] == slow["total_steps"] == slow["budget"]["total_steps"]
    # 4x the speed: about 4x the steps (the timed steps are spent either way)
    assert fast["steps"] > 3 * slow["steps"] > 3 * BUDGET_PROBE_STEPS, (slow["steps"], fast["steps"])
    assert fast["epoch"] >= 1  # (0-based) epochs=1 is ignored: the budget runs as many epochs as fit
    # The schedule is a cosine over the fixed total (after a refit, the rest of the first fix's cosine over the
    # steps left: `schedule_point`): the last step runs at about min_lr_ratio x lr.
    rows = read_metrics(str(tmp_path / "fast" / "metrics.jsonl"), "train")
    cfg = cfg_for(tiny_store, tmp_path, train_time_budget=10.0)
    with open(checkpoint.latest_step_dir(str(tmp_path / "fast")) + "/train_state.json") as f:
        state = json.load(f)
    assert state["budget"]["total_steps"] == state["total_steps"] == fast["steps"]
    budget = TimeBudget.resume(state, cfg)
    assert [r["lr"] for r in rows] == pytest.approx(
        [lr_at(*budget.schedule_point(r["step"] - 1, fast["steps"]), cfg, budget.warmup) for r in rows])
    assert rows[-1]["lr"] == pytest.approx(lr_at(fast["steps"] - 1, fast["steps"], cfg, budget.warmup), rel=0.05)


@pytest.mark.parametrize("cap", [1, 2, BUDGET_PROBE_STEPS + 2])
def test_max_steps_caps_a_budget_run_also_while_it_times(monkeypatch, tiny_store, tmp_path, cap):
    """max_steps below the timed steps ends the run there (it used to train until the timing was done)."""
    torch.set_num_threads(1)
    got = _budget_run(monkeypatch, tiny_store, tmp_path / f"cap{cap}", dt=0.125, max_steps=cap)
    assert got["steps"] == got["total_steps"] == cap and got["budget"]["fixed"]
    assert [r["step"] for r in read_metrics(str(tmp_path / f"cap{cap}" / "metrics.jsonl"), "train")] == \
        list(range(1, cap + 1))


def test_max_steps_at_another_runs_fixed_count_gives_its_schedule(monkeypatch, tiny_store, tmp_path):
    """The demo's engine comparison trains a second draft for the first one's step count under a budget that
    does not bind: same warm-up, same total, hence the same learning rates and the same loss curve. (Not after a
    refit: max_steps runs the plain cosine, not the first run's squeezed one; no refit here.)"""
    torch.set_num_threads(1)
    monkeypatch.setattr(budget_mod, "BUDGET_REFIT_STEPS", 10**6)
    ref = _budget_run(monkeypatch, tiny_store, tmp_path / "ref", dt=0.125)
    assert BUDGET_PROBE_STEPS + 2 < ref["steps"] < ref["budget"]["warmup"] * 50
    again = _budget_run(monkeypatch, tiny_store, tmp_path / "again", dt=0.5, budget=1e6, max_steps=ref["steps"])
    assert again["steps"] == ref["steps"] and again["budget"]["warmup"] == ref["budget"]["warmup"]
    lrs = [[r["lr"] for r in read_metrics(str(tmp_path / d / "metrics.jsonl"), "train")] for d in ("ref", "again")]
    assert lrs[0] == lrs[1]
    torch.testing.assert_close(torch.tensor(losses(tmp_path / "again")), torch.tensor(losses(tmp_path / "ref")),
                               rtol=1e-4, atol=1e-6)


def test_a_resumed_budget_run_keeps_the_fixed_steps_and_the_curve(monkeypatch, tiny_store, tmp_path, caplog):
    import re

    torch.set_num_threads(1)
    with caplog.at_level("INFO"):
        ref = _budget_run(monkeypatch, tiny_store, tmp_path / "ref", dt=0.125, save_every=1, keep=1000)
    ref_log = caplog.text
    caplog.clear()
    refit = ref["budget"]["measured"].get("refit")
    k = refit["at_step"] + 1 if refit else BUDGET_PROBE_STEPS + 3  # after the total was fixed the last time
    assert ref["steps"] > k + 1
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "ref", out)
    for d in out.glob("step-*"):
        if int(d.name.split("-")[1]) > k:
            shutil.rmtree(d)
    (out / "latest.json").write_text(json.dumps({"step": k, "dir": f"step-{k:08d}"}))
    # The same machine: the checkpoint's total and curve are kept, and the budget's clock goes on from the
    # checkpoint's (it used to start again: a retry at step k trained the whole budget once more).
    with caplog.at_level("INFO"):
        done = _budget_run(monkeypatch, tiny_store, out, dt=0.125, save_every=1, keep=1000)
    assert done["steps"] == ref["steps"]
    with open(out / f"step-{k:08d}" / "train_state.json") as f:
        spent_at_k = json.load(f)["budget"]["spent"]
    assert 0 < spent_at_k < ref["budget"]["spent"] and done["budget"]["spent"] == pytest.approx(
        ref["budget"]["spent"], rel=0.15)
    # Its progress names the samples of the k steps it resumed after: the reference's total less its own.
    whole = [int(m) for m in re.findall(r"train: \d+/(\d+) samples", ref_log)]
    rest = re.findall(r"train: \d+/(\d+) samples \(\+(\d+) kept from an earlier run\)", caplog.text)
    assert whole and rest and int(rest[-1][1]) == whole[-1] - int(rest[-1][0]) > 0, (whole[-1:], rest[-1:])
    torch.testing.assert_close(torch.tensor(losses(out)), torch.tensor(losses(tmp_path / "ref")), rtol=1e-4, atol=1e-6)


def _probed(seconds: float, eval_every: int = 0) -> TimeBudget:
    """A budget after the probe of the tests above: 100 tok/s as timed, 200 without first sights."""
    b = TimeBudget.start(TrainConfig(store="s", vocab="v", out="o", train_time_budget=seconds, eval_every=eval_every,
                                     warmup_ratio=0.1), provisional_total=80)
    b.record(1, 500, 7.0)
    for step in range(2, 2 + BUDGET_PROBE_STEPS):
        b.record_first_sight(1.25)
        b.record(step, 250, 7.0 + 2.5 * (step - 1))
    return b


def test_the_total_is_fixed_again_at_the_speed_of_the_cached_steps_hand_computed():
    """Four steps misjudge the cached steps (a demo planned 315 s and ran 393): once BUDGET_REFIT_STEPS of them
    and BUDGET_REFIT_SHARE of the budget are timed, the total is fixed again at their speed."""
    b = _probed(1000.0)
    # 982 s left (1 s for the final evaluation): 2 first-epoch steps of 10 s, then 192 cached ones of 5 s.
    assert b.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=2) == 5 + 2 + 192
    assert b.refit_from == 7  # the last first-epoch step: the timing starts when it ends
    b.record(6, 1000, 27.0)
    b.record(7, 1000, 37.0)
    elapsed = 37.0
    for step in range(8, 8 + BUDGET_REFIT_STEPS):  # the cached steps take 8 s, not 5: 125 tok/s
        assert not b.refit_due(step - 1)
        elapsed += 8.0
        b.record(step, 1000, elapsed)
        if step == 10:
            b.record_eval(2.0)  # an evaluation: timed apart, not training time
            elapsed += 2.0
    step = 7 + BUDGET_REFIT_STEPS
    assert BUDGET_REFIT_STEPS * 8.0 >= BUDGET_REFIT_SHARE * 1000.0 and b.refit_due(step)
    # 125 tok/s; evaluations cost the measured 2 s; 1000 - 199 - 2 = 799 s left: 99 steps of 8 s.
    assert elapsed == 199.0
    assert b.refit(step, elapsed, iter([1000] * 1000), heldout_tokens=300) == step + 99
    r = b.measured["refit"]
    assert (r["timed_steps"], r["tokens_per_s"], r["eval_seconds"], r["was_total"]) == (20, 125.0, 2.0, 199)
    assert b.refit_from is None and not b.refit_due(step + 50)  # once
    # The learning rate: the first fix's cosine from step 27 on, squeezed from 172 steps into 99.
    assert b.schedule_point(27, 126) == (27, 199) and b.schedule_point(10, 126) == (10, 199)
    assert b.schedule_point(126, 126) == (199, 199)
    assert b.schedule_point(76, 126) == (pytest.approx(27 + 49 * 172 / 99), 199)
    assert "refit at step 27" in b.describe() and "126 steps in all (was 199" in b.describe()
    assert TimeBudget.resume({"budget": b.to_dict()}, b_cfg := TrainConfig(store="s", vocab="v", out="o")).total_steps \
        == 126 and b_cfg  # the checkpoint keeps the refit total
    # Fast steps: 20 of them (20 s) are not yet 5% of the budget; the refit waits for 50 s of them.
    quick = _probed(1000.0)
    quick.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=0)
    for step in range(6, 60):
        quick.record(step, 1000, 17.0 + (step - 5))
        assert quick.refit_due(step) == (step - 5 >= 50), step


def test_a_run_resumed_before_the_refit_times_its_own_steps_for_it():
    b = _probed(1000.0)
    b.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=2)
    again = TimeBudget.resume({"budget": b.to_dict()}, TrainConfig(store="s", vocab="v", out="o"))
    assert (again.total_steps, again.refit_from, again.spent) == (199, 7, 17.0)
    # The loop's clock goes on from the checkpoint's 17 s; the resumed process's first step pays set-up: the
    # timing starts after it.
    again.record(31, 1000, 17.0 + 3.0)
    for step in range(32, 32 + BUDGET_REFIT_STEPS):
        assert not again.refit_due(step - 1)
        again.record(step, 1000, 17.0 + 3.0 + 4.0 * (step - 31))  # 250 tok/s on this machine
    step = 31 + BUDGET_REFIT_STEPS
    assert again.refit_due(step)
    # 1000 - (17 + 83) - 0.4 (no evaluation timed yet: 300 held-out tokens at a third of a step's cost per token,
    # 250 tok/s) = 899.6 s: 224 steps of 4 s.
    assert again.refit(step, 100.0, iter([1000] * 1000), heldout_tokens=300) == step + 224
    assert again.measured["refit"]["tokens_per_s"] == 250.0


def test_a_run_that_is_mostly_its_first_epoch_is_refit_on_first_epoch_steps_hand_computed():
    """A short budget is mostly first-epoch steps: waiting for cached ones to refit let a demo's 150-s budget run
    177 s (the first epoch ran at 915 tok/s, its 4 probed steps at 1,156). The refit times the first-epoch steps
    from the fix on and prices the cached ones after them at the first fix's ratio."""
    b = _probed(1000.0)  # 100 tok/s as timed, 200 without first sights: cached steps 2x as fast
    # 982 s left: 80 first-epoch steps of 10 s (800 s), then 36 cached ones of 5 s (180 s).
    assert b.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=80) == 5 + 80 + 36
    assert (b.refit_from, b.cached_at, b.cached_speedup) == (5, 85, 2.0)  # timed from now on
    elapsed = 17.0
    for step in range(6, 6 + BUDGET_REFIT_STEPS):  # the first epoch runs at 11 s a step, not 10
        assert not b.refit_due(step - 1)
        elapsed += 11.0
        b.record(step, 1000, elapsed)
    step = 5 + BUDGET_REFIT_STEPS
    assert b.refit_due(step) and elapsed == 237.0
    # 1000/11 tok/s; the final evaluation 300 / 3 / (1000/11) = 1.1 s; 761.9 s left: the 60 first-epoch steps
    # still to run (26..85) take 660 s, then cached steps of 5.5 s (the 2x measured at the fix): 18 in 99 s.
    assert b.refit(step, elapsed, iter([1000] * 1000), heldout_tokens=300) == step + 60 + 18
    assert b.measured["refit"]["planned_seconds"] == pytest.approx(660 + 99 + 1.1)
    again = TimeBudget.resume({"budget": b.to_dict()}, TrainConfig(store="s", vocab="v", out="o"))
    assert (again.total_steps, again.cached_at, again.cached_speedup, again.refit_from) == (103, 85, 2.0, None)
    # Where the cached steps are most of the run left, the refit still waits for them (as before).
    late = _probed(1000.0)
    late.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=2)
    assert (late.refit_from, late.cached_at) == (7, None)


def test_a_step_costs_more_than_its_tokens_hand_computed():
    """Least squares of seconds on real tokens, both terms >= 0 (eagle3.train.budget.step_cost)."""
    assert step_cost([(100, 0.3), (300, 0.5)]) == pytest.approx((0.2, 0.001))  # 0.2 s a step + 1 ms a token
    assert step_cost([(100, 0.4), (300, 0.4)]) == (0.4, 0.0)  # time does not follow tokens: per step
    assert step_cost([(100, 0.05), (300, 0.45)]) == (0.0, pytest.approx(0.5 / 400))  # no negative overhead
    assert step_cost([(1000, 8.0)] * 3) == (0.0, 0.008)  # one size: proportional, as before
    assert step_cost([(1000, 8.0)]) == (0.0, 0.008)


def test_the_refit_prices_a_step_by_its_fixed_cost_not_its_tokens_alone_hand_computed():
    """Steps cost 0.5 s whatever their tokens (a demo's did: 184 and 500 real tokens, ~0.41 s each). Timed on
    steps of 400 and 600 tokens, the rest (200-token steps) priced at tokens/s would run 2.3x the budget."""
    cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=100.1, eval_every=0, warmup_ratio=0.1)
    b = TimeBudget.start(cfg, provisional_total=80)
    b.record(1, 500, 1.0)
    for step in range(2, 2 + BUDGET_PROBE_STEPS):
        b.record(step, 500, 1.0 + 0.5 * (step - 1))
    future = [400, 600] * 10 + [200] * 1000
    # 1000 tok/s; 97.1 s left: the 20 mixed steps in 10 s, then 435 steps of 0.2 s.
    assert b.fix(5, 3.0, iter(future), heldout_tokens=0) == 5 + 20 + 435 and b.refit_from == 5
    elapsed = 3.0
    for step in range(6, 6 + BUDGET_REFIT_STEPS):
        elapsed += 0.5
        b.record(step, future[step - 6], elapsed)
        if step == 10:
            b.record_eval(2.0)  # inside the next step's interval: not that step's cost
            elapsed += 2.0
    step = 5 + BUDGET_REFIT_STEPS
    assert b.refit_due(step) and elapsed == 15.0
    # 0.5 s a step, 0 a token; the final evaluation 2 s (the one measured): 83.1 s left, 166 steps.
    assert b.refit(step, elapsed, iter([200] * 1000), heldout_tokens=0) == step + 166
    r = b.measured["refit"]
    assert (r["seconds_per_step"], r["seconds_per_token"], r["tokens_per_s"], r["eval_seconds"]) == (0.5, 0.0, 1000.0,
                                                                                                    2.0)


def _assert_lr_falls_smoothly_to_the_floor(tiny_store, out, got: dict):
    """No step's learning-rate drop is far above the median drop (a jump at a refit or re-plan), none rises,
    and the last is the cosine's floor. Returns (the config, the train rows)."""
    cfg = cfg_for(tiny_store, out, train_time_budget=20.0)
    rows = read_metrics(str(out / "metrics.jsonl"), "train")
    lrs = [r["lr"] for r in rows if r["step"] > got["budget"]["warmup"]]
    drops = [a - b for a, b in zip(lrs, lrs[1:])]
    assert min(drops) >= 0 and max(drops) < 2.5 * sorted(drops)[len(drops) // 2], drops
    assert lr_at(got["steps"] - 1, got["steps"], cfg, got["budget"]["warmup"]) == pytest.approx(lrs[-1], rel=0.05)
    return cfg, rows


class _SlowingClock(_Clock):
    """Runs ``dt`` per reading for the first ``fast_reads``, then ``slow`` times that: later steps cost more than
    the timed ones."""

    def __init__(self, dt: float, fast_reads: int, slow: float):
        super().__init__(dt)
        self.reads, self.fast_reads, self.slow = 0, fast_reads, slow

    def monotonic(self) -> float:
        self.reads += 1
        self.now += self.dt * (1 if self.reads <= self.fast_reads else self.slow)
        return self.now


def test_a_run_whose_later_steps_are_slower_ends_near_its_budget(monkeypatch, tiny_store, tmp_path, caplog):
    torch.set_num_threads(1)
    caplog.set_level("INFO", logger="eagle3.progress")
    clock = _SlowingClock(0.02, fast_reads=40, slow=1.5)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    start = clock.now
    got = loop.train(cfg_for(tiny_store, tmp_path / "run", token_budget=64, train_time_budget=20.0, epochs=1))
    refit = got["budget"]["measured"]["refit"]
    assert refit["was_total"] > got["steps"] == got["total_steps"] == got["budget"]["total_steps"]
    # Planned at the first steps' speed the run would have taken ~1.5x the budget; refit, it ends within it.
    assert 0.85 * 20.0 < clock.now - start <= 1.05 * 20.0, (clock.now - start, got["steps"], refit)
    with open(checkpoint.latest_step_dir(str(tmp_path / "run")) + "/train_state.json") as f:
        assert json.load(f)["budget"]["measured"]["refit"] == refit
    # The learning rate runs on without a jump at the refit and ends at the cosine's floor.
    _assert_lr_falls_smoothly_to_the_floor(tiny_store, tmp_path / "run", got)
    # Progress counts the samples of every epoch against the planned total (it read "2862/993 samples").
    done = [r.getMessage() for r in caplog.records if "done in" in r.getMessage()][-1]
    seen, planned = re.search(r"train: (\d+)/(\d+) samples", done).groups()
    assert seen == planned and int(seen) > 0, done


def _timed(b: TimeBudget, first: int, n: int, seconds: float, elapsed: float) -> float:
    """Record steps first+1 .. first+n of 1,000 tokens, ``seconds`` each; the elapsed time after them."""
    for step in range(first + 1, first + n + 1):
        elapsed += seconds
        b.record(step, 1000, elapsed)
    return elapsed


def test_load_after_the_refit_is_met_by_a_re_plan_hand_computed():
    """A demo's 169-s budget ran 224 s: the machine's load grew after the refit, which was the last change. Now
    every window after it checks the plan at its steps' speed and re-plans past BUDGET_DRIFT of the budget."""
    b = _probed(1000.0)
    # Every step cached: 200 tok/s, 5 s a step; the final evaluation 1 s; 982 s left: 196 steps.
    assert b.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=0) == 201
    elapsed = _timed(b, 5, BUDGET_REFIT_STEPS, 5.5, 17.0)  # 5.5 s a step, not 5
    assert b.refit_due(25) and elapsed == 127.0
    # 0.0055 s a token; the final evaluation 300 / 3 * 0.0055 = 0.55 s; 872.45 s left: 158 steps of 5.5 s.
    b.agree(b.refit(25, elapsed, iter([1000] * 1000), heldout_tokens=300))
    assert b.total_steps == 183 and "replans" not in b.measured
    assert not b.refit_due(25)  # a new window starts at the refit
    # Load comes: 6.6 s a step. The plan's 138 steps left would take 910.8 s of the 740.34 left.
    elapsed = _timed(b, 25, BUDGET_REFIT_STEPS - 1, 6.6, elapsed)
    assert not b.refit_due(44)
    elapsed = _timed(b, 44, 1, 6.6, elapsed)
    assert b.refit_due(45) and elapsed == pytest.approx(259.0)
    b.agree(b.refit(45, elapsed, iter([1000] * 1000), heldout_tokens=300))
    assert b.total_steps == 45 + 112  # 740.34 / 6.6
    (r,) = b.measured["replans"]
    assert (r["at_step"], r["was_total"], r["timed_steps"]) == (45, 183, 20)
    assert r["tokens_per_s"] == pytest.approx(151.5, abs=0.1)
    assert r["projected_seconds"] == pytest.approx(259 + 910.8 + 0.66, abs=1e-3)
    assert "re-planned at step 45" in b.describe() and "157 steps in all (was 183)" in b.describe()
    # The learning rate: the first fix's cosine (201 steps), squeezed at the refit from step 25 into 158 steps,
    # then again from step 45 into 112: continuous at both pivots, ending at the cosine's floor.
    refit_only = copy.deepcopy(b)
    refit_only.measured.pop("replans")
    assert b.schedule_point(45, 157) == refit_only.schedule_point(45, 183) == (pytest.approx(25 + 20 * 176 / 158), 201)
    assert b.schedule_point(30, 157) == refit_only.schedule_point(30, 183)  # what step 30 ran at
    assert b.schedule_point(101, 157) == (pytest.approx(25 + (45 + 56 * 138 / 112 - 25) * 176 / 158), 201)
    assert b.schedule_point(157, 157) == (pytest.approx(201), 201)
    # The same speed in the next window: the plan ends within BUDGET_DRIFT of the budget, no re-plan.
    elapsed = _timed(b, 45, BUDGET_REFIT_STEPS, 6.6, elapsed)
    b.agree(b.refit(65, elapsed, iter([1000] * 1000), heldout_tokens=300))
    assert b.total_steps == 157 and len(b.measured["replans"]) == 1
    assert abs(92 * 6.6 - (1000 - elapsed - 0.66)) <= BUDGET_DRIFT * 1000  # 607.2 s planned, 608.3 left
    # Another rank re-planned to fewer steps: this one records the same re-plan (its curve must be theirs).
    other = copy.deepcopy(b)
    elapsed2 = _timed(other, 65, BUDGET_REFIT_STEPS, 6.6, elapsed)
    other.refit(85, elapsed2, iter([1000] * 1000), heldout_tokens=300)
    other.agree(150)
    assert (other.total_steps, other.measured["replans"][-1]["was_total"]) == (150, 157)
    # A resumed run keeps the re-plans and so the curve, and checks its own windows after its first step.
    again = TimeBudget.resume({"budget": b.to_dict()}, TrainConfig(store="s", vocab="v", out="o"))
    assert again.schedule_point(101, 157) == b.schedule_point(101, 157) and again.refitted
    resumed = _timed(again, 70, BUDGET_REFIT_STEPS, 6.6, 0.0)  # its first step (71) pays set-up: not timed
    assert not again.refit_due(90)
    _timed(again, 90, 1, 6.6, resumed)
    assert again.refit_due(91)


def test_a_drift_re_plans_when_seen_twice_in_a_row_hand_computed():
    """Windows differ by their batches: a 450-s run's read 1,806, 1,996 and 1,802 tok/s and re-planned down, up and
    down. A drift past BUDGET_DRIFT re-plans when the next check sees it too (or when it is 3x that)."""
    b = _probed(1000.0)
    assert b.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300, cached_from=0) == 201  # 5 s a step
    elapsed = _timed(b, 5, BUDGET_REFIT_STEPS, 5.0, 17.0)
    b.agree(b.refit(25, elapsed, iter([1000] * 1000), heldout_tokens=300))
    assert b.total_steps == 201  # 882.5 s left: 176 steps of 5 s
    totals = []
    for first, seconds in ((25, 5.5), (45, 4.5), (65, 4.5)):
        elapsed = _timed(b, first, BUDGET_REFIT_STEPS, seconds, elapsed)
        assert b.refit_due(first + BUDGET_REFIT_STEPS)
        b.agree(b.refit(first + BUDGET_REFIT_STEPS, elapsed, iter([1000] * 1000), heldout_tokens=300))
        totals.append(b.total_steps)
    # At 45: 156 steps of 5.5 s = 858 s for 772.45 left, +8.6% (once: kept). At 65: 136 of 4.5 s = 612 for
    # 682.55, -7.1% (the other way: kept). At 85: 116 of 4.5 = 522 for 592.55, -7.1% again: 131 steps of 4.5 s.
    assert totals == [201, 201, 85 + 131] and len(b.measured["replans"]) == 1


class _LoadedClock(_Clock):
    """Runs ``dt`` per reading until ``at`` seconds, then ``slow`` times that: load that comes mid-run."""

    def __init__(self, dt: float, at: float, slow: float):
        super().__init__(dt)
        self.at, self.slow = at, slow

    def monotonic(self) -> float:
        self.now += self.dt * (self.slow if self.now >= self.at else 1)
        return self.now


def test_a_run_loaded_after_its_refit_ends_near_its_budget(monkeypatch, tiny_store, tmp_path):
    torch.set_num_threads(1)
    clock = _LoadedClock(0.02, at=9.0, slow=1.5)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    got = loop.train(cfg_for(tiny_store, tmp_path / "run", token_budget=64, train_time_budget=20.0, epochs=1))
    m = got["budget"]["measured"]
    assert m["refit"]["elapsed_s"] < 9.0 < m["replans"][0]["elapsed_s"], m  # the load came after the refit
    assert m["replans"][0]["projected_seconds"] > (1 + BUDGET_DRIFT) * 20.0
    # The refit's plan would have run ~1.3x the budget; re-planned, the run ends within it.
    assert 0.9 * 20.0 < clock.now <= 1.05 * 20.0, (clock.now, got["steps"], m)
    # The learning rate falls without a jump at either pivot, to the cosine's floor.
    cfg, rows = _assert_lr_falls_smoothly_to_the_floor(tiny_store, tmp_path / "run", got)
    budget = TimeBudget.resume({"budget": got["budget"]}, cfg)
    assert [r["lr"] for r in rows] == pytest.approx(
        [lr_at(*budget.schedule_point(r["step"] - 1, got["steps"]), cfg, budget.warmup) for r in rows])


def test_another_runs_schedule_is_replayed_untimed(monkeypatch, tiny_store, tmp_path):
    """bench/paired_bench.py trains a second draft for the first one's steps: on its curve (refit and re-plans
    included), not a plain cosine over them, whatever this machine's speed."""
    torch.set_num_threads(1)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=_LoadedClock(0.02, at=9.0, slow=1.5).monotonic))
    ref = loop.train(cfg_for(tiny_store, tmp_path / "ref", token_budget=64, train_time_budget=20.0, epochs=1))
    assert ref["budget"]["measured"]["replans"]
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=_Clock(0.5).monotonic))  # 25x slower
    again = loop.train(cfg_for(tiny_store, tmp_path / "again", token_budget=64, epochs=1,
                               schedule_from=str(tmp_path / "ref")))
    assert again["steps"] == ref["steps"] and again["budget"]["replayed"]
    assert again["budget"]["measured"] == ref["budget"]["measured"]  # nothing timed, nothing re-planned
    lrs = [[r["lr"] for r in read_metrics(str(tmp_path / d / "metrics.jsonl"), "train")] for d in ("ref", "again")]
    assert lrs[0] == lrs[1]
    torch.testing.assert_close(torch.tensor(losses(tmp_path / "again")), torch.tensor(losses(tmp_path / "ref")),
                               rtol=1e-4, atol=1e-6)
    capped = loop.train(cfg_for(tiny_store, tmp_path / "capped", token_budget=64, epochs=1, max_steps=7,
                                schedule_from=str(tmp_path / "ref")))
    assert capped["steps"] == 7
    # A checkpoint without a fixed budget, or none at all: the error names the file and the fix.
    plain = tmp_path / "plain"
    loop.train(cfg_for(tiny_store, plain, token_budget=64, max_steps=2))
    with pytest.raises(InputError, match=r"train_state\.json: that run had no time budget.*--max-steps"):
        loop.train(cfg_for(tiny_store, tmp_path / "x", token_budget=64, schedule_from=str(plain)))
    with pytest.raises(InputError, match="no checkpoint there"):
        loop.train(cfg_for(tiny_store, tmp_path / "y", token_budget=64, schedule_from=str(tmp_path / "none")))
    with pytest.raises(InputError, match="schedule_from replays"):
        TrainConfig(store="s", vocab="v", out="o", schedule_from="c", train_time_budget=150)


def test_a_re_plan_that_ends_the_run_between_log_lines_still_logs_the_last_step(monkeypatch, tiny_store, tmp_path,
                                                                                 caplog):
    """A re-plan can end the run at the step just taken (total = step). That step came before the re-plan and was
    not due a line (log_every 10, total then larger): its metrics row and "step N/N" line are written anyway, so
    the last train row is the last step (test_distributed's two-rank run met this under load)."""
    torch.set_num_threads(1)
    end = 13  # after the fix (step BUDGET_PROBE_STEPS + 1), not a multiple of log_every
    monkeypatch.setattr(TimeBudget, "refit_due", lambda self, step: step == end)
    monkeypatch.setattr(TimeBudget, "refit", lambda self, step, *a, **k: step)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=_Clock(0.01).monotonic))
    with caplog.at_level("INFO", logger="eagle3.train.loop"):
        got = loop.train(cfg_for(tiny_store, tmp_path / "run", token_budget=64, train_time_budget=60.0, epochs=1,
                                 log_every=10))
    assert got["steps"] == got["total_steps"] == end
    rows = read_metrics(str(tmp_path / "run" / "metrics.jsonl"), "train")
    assert [r["step"] for r in rows] == [10, end]
    assert f"step {end}/{end} loss" in caplog.text


def test_a_retry_that_starts_late_still_ends_by_the_deadline_hand_computed():
    """A retry that waited (for a device, the retry delay) goes on from its checkpoint's clock and ends by the
    run's deadline, never below train_time_budget."""
    b = _probed(1000.0)
    b.fix(5, 17.0, iter([1000] * 1000), heldout_tokens=300)
    saved = {"budget": b.to_dict()}
    cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=150, train_deadline=10_000.0)
    # 17 s spent; the retry starts 300 s before the deadline: 317 s of budget, not 1000
    assert TimeBudget.resume(saved, cfg, now=9_700.0).seconds == pytest.approx(317.0)
    assert TimeBudget.resume(saved, cfg, now=9_990.0).seconds == pytest.approx(150.0)  # the floor
    assert TimeBudget.resume(saved, cfg, now=8_000.0).seconds == pytest.approx(1000.0)  # never stretched
    assert TimeBudget.resume(saved, TrainConfig(store="s", vocab="v", out="o")).seconds == 1000.0  # no deadline


def test_a_budget_shorter_than_the_epochs_plan_leaves_its_warm_up_hand_computed():
    """3 epochs planned 60,000 steps (warm-up 2%: 1,200) but the budget fits 360: the warm-up becomes 2% of 360
    (7, at least the untimed first step + the 4 timed ones), so the run reaches the peak and decays; it used to end
    at 0.3 of the peak inside its warm-up."""
    cfg = TrainConfig(store="s", vocab="v", out="o", train_time_budget=3600.0)
    b = TimeBudget.start(cfg, provisional_total=60_000)
    assert b.warmup == 1200
    b.record(1, 100, 10.0)
    for step in range(2, 2 + BUDGET_PROBE_STEPS):
        b.record(step, 100, 10.0 * step)  # 10 s a step
    total = b.fix(1 + BUDGET_PROBE_STEPS, 50.0, iter([100] * 100_000), heldout_tokens=0)
    assert total == 5 + 355 and b.warmup == 1200  # the ranks agree on a total first
    b.agree(total - 10)  # another rank timed fewer steps: the warm-up fits the agreed total, alike on every rank
    total -= 10
    assert b.warmup == round(0.02 * total) == 7
    assert lr_at(*b.schedule_point(total - 1, total), cfg, b.warmup) == pytest.approx(cfg.lr * cfg.min_lr_ratio,
                                                                                       rel=0.01)
    assert TimeBudget.resume({"budget": b.to_dict()}, cfg).warmup == 7
