"""The pace keeper (engine/generation_pace.py): encoder passes beside a
decoding batch are spaced out until the batch's steps are back within the
tolerance of their pace without passes, and never starved."""

from __future__ import annotations

import random
import statistics

import pytest

from mlxd.engine.generation_pace import PaceKeeper


class Device:
    """A batch stepping every ``period`` seconds, stretched by ``cost`` (a
    fraction) while a pass runs, and an encoder whose clients always have
    work: it starts a pass whenever the keeper lets it and none is running;
    a pass lasts ``pass_s``. Decisions are taken at step boundaries."""

    def __init__(self, keeper: PaceKeeper, period: float = 0.010, cost: float = 0.4, pass_s: float = 0.004,
                 spread: float = 0.0):
        self.keeper, self.period, self.cost, self.pass_s = keeper, period, cost, pass_s
        # Steps whose lengths vary (a CPU's): log-normal, seeded.
        self.spread, self.random = spread, random.Random(7)
        self.now = 0.0
        self.pass_ends: float | None = None
        self.passes = 0
        self.periods: list[float] = []
        self.pass_starts: list[float] = []

    def run(self, steps: int, rows: int = 1) -> None:
        for _ in range(steps):
            passing = self.pass_ends is not None
            base = self.period * self.random.lognormvariate(0, self.spread) if self.spread else self.period
            period = base * (1 + self.cost) if passing else base
            self.now += period
            self.periods.append(period)
            if self.pass_ends is not None and self.pass_ends <= self.now:
                self.keeper.ended(self.now)
                self.pass_ends = None
            self.keeper.step(self.now, rows, steady=True)
            if self.pass_ends is None and self.keeper.wait_s(self.now) == 0:
                self.keeper.began(self.now)
                self.pass_starts.append(self.now)
                self.pass_ends = self.now + self.pass_s
                self.passes += 1

    def slowdown(self, last: int) -> float:
        return statistics.fmean(self.periods[-last:]) / self.period - 1


def test_passes_that_slow_the_steps_are_spaced_until_the_steps_keep_their_pace():
    unpaced = Device(PaceKeeper(max_pause_s=0.0, min_pause_s=0.0))
    unpaced.run(3000)
    assert unpaced.slowdown(1000) > 0.35  # a pass in nearly every period, each 40 % longer

    paced = Device(PaceKeeper(tolerance=0.05))
    paced.run(3000)
    assert paced.slowdown(1000) <= 0.06
    assert paced.keeper.pause_s > 0
    # The passes are spaced, not stopped: still one every few steps.
    assert paced.passes > 3000 * 0.010 / (paced.keeper.max_pause_s + 0.010)


def test_passes_that_cost_the_steps_nothing_are_never_held_back():
    device = Device(PaceKeeper(), cost=0.0)
    device.run(3000)
    assert device.keeper.pause_s == 0.0
    assert device.keeper.slowdown is not None and abs(device.keeper.slowdown) < 0.01
    # Only the holds that keep the clean figure current took passes' room:
    # 3 steps in each 64, and the first steps while it was measured.
    assert device.passes >= 3000 * 0.8 / 2


def test_steps_whose_lengths_vary_do_not_read_as_slowed_by_passes_that_cost_nothing():
    device = Device(PaceKeeper(), cost=0.0, spread=0.35)
    device.run(5000)
    assert device.keeper.pause_s < 0.004
    assert device.passes >= 5000 * 0.6


def test_however_dear_the_passes_one_still_runs_every_max_pause():
    keeper = PaceKeeper(max_pause_s=0.1)
    device = Device(keeper, cost=5.0)
    device.run(5000)
    assert keeper.pause_s == 0.1
    gaps = [b - a for a, b in zip(device.pass_starts[-50:], device.pass_starts[-49:])]
    # The pause, plus the steps (of 10-60 ms) that end it and a hold now and then.
    assert max(gaps) < 0.1 + 0.010 * 6 * (keeper.hold_steps + 2)


def test_with_nothing_decoding_a_pass_goes_at_once():
    keeper = PaceKeeper(idle_s=0.5)
    assert keeper.wait_s(0.0) == 0.0
    device = Device(keeper, cost=1.0)
    device.run(2000)
    assert keeper.pause_s > 0.002
    assert keeper.wait_s(device.pass_starts[-1] + 0.001) > 0
    # The batch's last step half a second ago: nothing decodes any more.
    assert keeper.wait_s(device.now + 0.5) == 0.0


def test_the_first_steps_hold_the_passes_until_the_pace_without_them_is_known():
    keeper = PaceKeeper(min_samples=8, hold_steps=3)
    now = 0.0
    keeper.began(now)  # a pass in flight: its periods are not clean
    held = []
    for _ in range(20):
        now += 0.01
        keeper.step(now, 1, steady=True)
        held.append(keeper.wait_s(now) > 0)
        if keeper._passing:
            keeper.ended(now)
    # Held as soon as the chain of steady steps began, until 8 clean periods were in.
    assert held[1] and sum(held) >= 8


def test_a_step_that_took_rows_in_or_out_measures_no_period():
    keeper = PaceKeeper(min_samples=2)
    keeper.step(0.0, 1, steady=True)
    keeper.step(1.0, 1, steady=False)  # a join: a second of it is no decode period
    keeper.step(1.01, 1, steady=True)
    keeper.step(1.02, 2, steady=True)  # another mix: starts its own chain
    keeper.step(1.05, 2, steady=True)
    assert list(keeper._mixes[1].clean) == [pytest.approx(0.01)]
    assert list(keeper._mixes[2].clean) == [pytest.approx(0.03)]


def test_a_pass_is_paced_only_for_a_batch_as_urgent_as_its_callers():
    keeper = PaceKeeper()
    now = 0.0
    for _ in range(4):  # a bulk generation, being measured: passes held
        now += 0.01
        keeper.step(now, 1, steady=True, urgency=2)
    assert keeper.wait_s(now, urgency=2) > 0  # bulk embeddings wait for a bulk generation
    assert keeper.wait_s(now, urgency=1) == 0  # the default class does not
    now += 0.01
    keeper.step(now, 2, steady=False, urgency=1)  # a default-class request joins
    keeper.step(now + 0.01, 2, steady=True, urgency=1)
    assert keeper.wait_s(now + 0.01, urgency=1) > 0


def test_requests_arriving_more_often_than_the_pause_do_not_hold_the_passes_back():
    keeper = PaceKeeper(min_samples=2, hold_every=1000)
    keeper.pause_s = 0.5
    now = 0.0
    for _ in range(4):  # the clean pace is known
        now += 0.01
        keeper.step(now, 1, steady=True)
    keeper.began(now)
    keeper.ended(now)
    last_pass = now
    while now < last_pass + 0.6:
        now += 0.01
        keeper.step(now, 1, steady=True)
        if round(now * 100) % 10 == 0:
            keeper.touched(now)  # a request every 0.1 s
    assert keeper.wait_s(now) == 0.0
