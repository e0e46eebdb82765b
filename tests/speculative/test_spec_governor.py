"""The auto-off, fed measured step times: a mix where speculation loses turns
it off within a bounded number of steps and costs little after; a mix where
it wins keeps it on, or turns it back on within a bounded number of steps."""

from __future__ import annotations

from mlxd.engine.speculative_governor import Governor, context_of, mix_of


class Mix:
    """A batch of ``rows``: a plain step emits one token a row in
    ``plain_s``; a speculative one ``per_row`` tokens a row in ``spec_s``."""

    def __init__(self, rows: int, plain_s: float, spec_s: float, per_row: float, context: int = 0) -> None:
        self.rows, self.plain_s, self.spec_s, self.per_row = rows, plain_s, spec_s, per_row
        self.context = context  # all rows' tokens together

    def drive(self, governor: Governor, steps: int, kept_a_row: float | None = None) -> list[bool]:
        """``kept_a_row``: each plain step is followed by prompt lookup's
        shadow, its drafts having kept that much of each row's token."""
        chosen = []
        for _ in range(steps):
            speculate = governor.choose(self.rows, self.context)
            chosen.append(speculate)
            if speculate:
                governor.record(True, round(self.rows * self.per_row), self.spec_s)
            else:
                governor.record(False, self.rows, self.plain_s)
                if kept_a_row is not None:
                    governor.shadow(self.rows, round(self.rows * kept_a_row))
        return chosen


class Batch(Mix):
    """As ``Mix``, and as the batch sends them: the first plain step after
    a speculative one is sent as speculative and leaving, ``leave_s``
    (it also pays for leaving the verify step)."""

    def __init__(self, rows: int, plain_s: float, spec_s: float, per_row: float, leave_s: float) -> None:
        super().__init__(rows, plain_s, spec_s, per_row)
        self.leave_s = leave_s
        self.last_speculated = False

    def step(self, governor: Governor, spec_s: float | None = None, per_row: float | None = None) -> bool:
        speculate = governor.choose(self.rows, self.context)
        if speculate:
            governor.record(True, round(self.rows * (per_row or self.per_row)), spec_s or self.spec_s)
        elif self.last_speculated:
            governor.record(True, self.rows, self.leave_s, leaving=True)
        else:
            governor.record(False, self.rows, self.plain_s)
        self.last_speculated = speculate
        return speculate

    def drive(self, governor: Governor, steps: int) -> list[bool]:
        return [self.step(governor) for _ in range(steps)]


# Eight streams where a verify step costs twice a plain one and keeps 1.3
# tokens a row: 0.65x (the H200's 8-stream figure).
LOSING = Mix(8, 0.010, 0.020, 1.3)
# One code-edit stream: a verify step costs 1.2 plain ones and keeps 2.7 tokens.
WINNING = Mix(1, 0.010, 0.012, 2.7)


def test_a_losing_mix_is_off_within_ten_steps_and_then_rarely_probed() -> None:
    governor = Governor()
    chosen = LOSING.drive(governor, 10)
    assert not governor.active and governor.speedup < 1.0
    assert chosen.count(True) == governor.min_spec == 6
    later = LOSING.drive(governor, 400)
    # Probes back off (8, 16, 32, 64, 128 steps apart): a handful in 400 steps.
    assert 4 <= later.count(True) <= 10 and not governor.active
    # Mixes of 5 to 8 rows share the decision.
    assert governor.choose(6) is False and not governor.active
    assert mix_of(5) == mix_of(8) == 8 and mix_of(1) == 1 and mix_of(3) == 4


def test_a_winning_mix_stays_on_with_a_plain_step_in_sixteen() -> None:
    governor = Governor()
    chosen = WINNING.drive(governor, 160)
    assert governor.active and governor.speedup > 2.0
    # Two plain steps for the baseline, two more soon after, then two in a
    # row every 32 steps: the batch times only the second of a run.
    assert chosen[:10] == [True, False, False, True, True, False, False, True, True, True]
    assert [i for i in range(10, 160) if not chosen[i]] == [31, 32, 63, 64, 95, 96, 127, 128, 159]
    assert chosen.count(False) <= 4 + 160 // 16


def test_a_losing_mix_goes_off_when_the_first_plain_step_of_a_run_pays_for_leaving_speculation() -> None:
    """As the batch drives it: the first plain step after a speculative one
    takes twice a plain step's time and is not recorded (speculative_batch's
    ``_plain_ahead``). Timed, it halved the baseline: a verify step costing
    1.6 plain ones and keeping 1.3 tokens a row (0.81x) read as 1.6x."""
    governor = Governor()
    rows, plain_s, spec_s, per_row = 4, 0.010, 0.016, 1.3
    previous_plain = False
    for _ in range(40):
        speculate = governor.choose(rows)
        if speculate:
            governor.record(True, round(rows * per_row), spec_s)
        elif previous_plain:
            governor.record(False, rows, plain_s)
        previous_plain = not speculate
    assert not governor.active and governor.speedup < 1.0


def test_an_answer_that_opens_without_drafts_keeps_it_on_when_the_echo_follows() -> None:
    # A code edit's answer opens with text the prompt does not hold ("Here is
    # the file with the change:"): its first steps keep no drafts, then the
    # echo of the file begins. Six speculative steps decide, not three.
    governor = Governor()
    Mix(1, 0.010, 0.012, 1.0).drive(governor, 6)
    assert governor.active
    WINNING.drive(governor, 32)
    assert governor.active and governor.speedup > 1.0


def test_a_slow_start_turns_it_off_but_the_probes_bring_it_back_soon() -> None:
    governor = Governor()
    Mix(1, 0.010, 0.012, 1.0).drive(governor, 12)
    assert not governor.active
    chosen = WINNING.drive(governor, 32)
    assert governor.active
    on_at = next(i for i in range(len(chosen)) if governor_after(chosen, i))
    assert on_at <= governor.max_retry + governor.retry_samples * governor.retry_every


def governor_after(chosen: list[bool], i: int) -> bool:
    """From step i on, speculation is on: every step but the probes speculates."""
    rest = chosen[i:]
    return len(rest) >= 4 and rest[:4].count(True) >= 3


def test_the_mix_changing_under_one_batch_size_flips_it_both_ways_within_bounds() -> None:
    governor = Governor()
    WINNING.drive(governor, 40)
    assert governor.active
    # The same single stream turns to free chat that drafts wrong: off
    # within the window of recent speculative steps.
    losing_one = Mix(1, 0.010, 0.020, 1.1)
    chosen = losing_one.drive(governor, governor.window + 4)
    assert not governor.active
    assert chosen.count(True) <= governor.window + 1
    # Long off, backed off to the longest interval; then the edit comes back.
    losing_one.drive(governor, 300)
    chosen = WINNING.drive(governor, governor.max_retry + 3 * governor.retry_every)
    assert governor.active
    assert chosen[-governor.retry_every :].count(True) >= governor.retry_every - 1


def test_a_request_joining_makes_the_next_probe_come_soon() -> None:
    governor = Governor()
    LOSING.drive(governor, 400)
    governor.joined()
    chosen = LOSING.drive(governor, governor.retry_every)
    assert True in chosen
    # The step that takes the new rows in is not measured, so it never probes.
    assert chosen[0] is False


def test_the_steps_after_an_unrecorded_join_step_are_measured() -> None:
    """The batch does not time the first of a run of plain steps, the join
    step among them. The join's mark belongs to that step: the run's second
    step is a real sample and counts, so two plain samples and one
    speculative step give a speed-up (a mark left for the next record
    dropped the second step, and there was none yet)."""
    governor = Governor(min_spec=1, min_plain=2)
    governor.joined()
    governor.choose(1)  # the join step, not recorded (the first of a plain run)
    for _ in range(2):
        assert governor.choose(1) is False
        governor.record(False, 1, 0.010)
    assert governor.choose(1) is True
    governor.record(True, 3, 0.012)
    assert governor.speedup == 3 / 0.012 / 100


def test_requests_joining_all_the_time_cost_a_losing_mix_one_probe_each() -> None:
    """Continuous batching: a request joins every 40 steps. Each gets its
    probe; the losing probes' backoff is kept, where starting it over at
    every join probed at 8, 16 and 32 steps after each."""
    governor = Governor()
    LOSING.drive(governor, 400)
    probes = 0
    for _ in range(10):
        governor.joined()
        chosen = LOSING.drive(governor, 40)
        assert True in chosen[: governor.retry_every]
        probes += chosen.count(True)
    assert probes <= 12 and not governor.active


def test_a_winning_request_joining_a_losing_batch_turns_it_back_on_soon() -> None:
    governor = Governor()
    LOSING.drive(governor, 400)
    governor.joined()
    winning_eight = Mix(8, 0.010, 0.016, 2.7)
    chosen = winning_eight.drive(governor, 3 * governor.retry_every)
    assert governor.active and chosen[-4:].count(True) >= 3


def test_steps_without_drafts_measure_the_baseline_and_never_turn_it_off() -> None:
    governor = Governor()
    for _ in range(50):
        governor.choose(4)
        governor.record(False, 4, 0.01)
    assert governor.active and governor.speedup is None


def test_a_mix_not_decided_yet_starts_off_after_another_lost_and_its_probes_decide() -> None:
    # Rows leave a losing batch of 8 until two are left: a mix of its own,
    # which a short batch could end before any trial of it had finished.
    governor = Governor()
    LOSING.drive(governor, 20)
    assert not governor.active
    two_losing = Mix(2, 0.010, 0.020, 1.3)
    assert two_losing.drive(governor, 6) == [False] * 6 and not governor.active
    # Where speculation pays after all, its probes turn it back on within bounds.
    two_winning = Mix(2, 0.010, 0.012, 2.7)
    chosen = two_winning.drive(governor, 40)
    assert governor.active and chosen[-8:].count(True) >= 6


def test_held_on_it_speculates_at_every_step_but_its_baseline_and_says_what_that_costs():
    governor = Governor(hold_on=True)
    chosen = LOSING.drive(governor, 100)
    assert chosen.count(True) >= 90 and governor.active
    assert governor.speedup is not None and governor.speedup < 1.0
    # A mix opens whenever a row ends or the context doubles: its first steps
    # speculate too, not its baseline's (a short mix would otherwise never draft).
    assert Mix(3, 0.010, 0.020, 1.3).drive(governor, 8) == [True] * 8



def test_auto_off_false_holds_the_governor_on():
    from mlxd.engine.speculation import Speculation
    from mlxd.registry.model import SpeculativeSpec

    assert not Speculation(SpeculativeSpec("draft", 4, "d")).governor.hold_on
    forced = Speculation(SpeculativeSpec("draft", 4, "d", auto_off=False)).governor
    assert forced.active and LOSING.drive(forced, 40).count(True) >= 35 and forced.active


def test_short_chats_after_long_code_edits_are_measured_against_their_own_plain_steps() -> None:
    """A plain step over 2,500-token contexts costs more than one over 300:
    free chat that loses (a verify step at 1.3 plain steps of its own for
    1.1 tokens) measured against the code edit's slower plain steps read as
    a win. Mixes of other context scales keep baselines of their own."""
    governor = Governor()
    code_edit = Mix(1, 0.014, 0.017, 2.7, context=2500)
    chat = Mix(1, 0.010, 0.013, 1.1, context=300)
    code_edit.drive(governor, 200)
    assert governor.active and governor.speedup > 2.0
    chat.drive(governor, 60)
    assert not governor.active and governor.speedup < 1.0
    # The code edit's own decision stands when it comes back.
    assert code_edit.drive(governor, 8).count(True) >= 6
    assert context_of(1, 2500) == 4096 and context_of(8, 8 * 300) == 512 and context_of(4, 0) == 0


def test_a_probe_is_judged_with_its_leaving_step_and_one_lucky_probe_does_not_turn_it_on() -> None:
    """Off, each probe is a verify step and the plain step after it, which
    pays for leaving it: the two are one probe. Counted apart, every
    leaving step read as a losing probe of its own, and the last two
    samples that turn speculation back on were one probe and its leaving
    step, so a single lucky probe did it."""
    governor = Governor()
    losing = Batch(8, 0.010, 0.020, 1.3, leave_s=0.020)
    losing.drive(governor, 400)
    assert not governor.active
    probes = 0
    for _ in range(300):
        lucky = probes == 0
        if losing.step(governor, spec_s=0.016 if lucky else None, per_row=3.5 if lucky else None):
            probes += 1
        if probes == 1 and not losing.last_speculated:
            # The lucky probe and its leaving step pay (36 tokens in 36 ms
            # against 800 tok/s plain); with the losing probe before it they do not.
            assert not governor.active
    assert probes >= 2 and not governor.active


def test_probes_that_pay_with_their_leaving_steps_turn_it_back_on() -> None:
    governor = Governor()
    Batch(8, 0.010, 0.020, 1.3, leave_s=0.020).drive(governor, 400)
    assert not governor.active
    # Now a verify step keeps 3.5 tokens a row: with its leaving step, 36
    # tokens in 36 ms, 1.25x plain decoding. A probe that pays brings the
    # next within 8 steps, and two together turn it on.
    winning = Batch(8, 0.010, 0.016, 3.5, leave_s=0.020)
    chosen = winning.drive(governor, governor.max_retry + 3 * governor.retry_every)
    assert governor.active and chosen[-4:].count(True) >= 3


def test_the_step_leaving_the_verify_step_that_turned_it_off_is_no_probe() -> None:
    governor = Governor()
    losing = Batch(8, 0.010, 0.020, 1.3, leave_s=0.020)
    while governor.active:
        losing.step(governor)
    losing.step(governor)  # leaves the last verify step: not a probe
    # So the first probe still comes within retry_every steps.
    assert True in losing.drive(governor, governor.retry_every)


def test_off_it_skips_the_probes_its_drafts_shadow_says_would_lose_and_probes_when_they_would_pay():
    """Free chat, off: plain steps where prompt lookup's drafts would have
    kept nothing need no probe to say speculation still loses, and each
    probe costs a verify step and its leaving step (a few per cent of an
    H100's free-chat pace). When the drafts start to match (a code edit),
    the next probe comes, and speculation is back on."""
    with_shadow, without = Governor(), Governor()
    LOSING.drive(with_shadow, 20)
    LOSING.drive(without, 20)
    assert not with_shadow.active and not without.active
    assert LOSING.drive(with_shadow, 300, kept_a_row=0.0).count(True) == 0
    # A draft model has no shadow: it probes as before.
    assert LOSING.drive(without, 300).count(True) >= 3
    # Now the drafts would keep most of each row's tokens, and verifying pays.
    editing = Mix(8, 0.010, 0.020, 4.0)
    chosen = editing.drive(with_shadow, 40, kept_a_row=0.75)
    # Within two probe intervals (16 steps here): the first may still hold the free chat's shadow.
    assert with_shadow.active and chosen[:32].count(True) >= 1, chosen


def test_one_row_off_waits_for_enough_shadow_rather_than_probing_blind():
    """One stream sees 8 tokens between two checks, under the 16 the shadow
    needs: the first check waits for the next instead of probing."""
    governor = Governor()
    one_losing = Mix(1, 0.010, 0.0145, 1.0)  # a verify step at 1.45 plain ones that keeps nothing
    one_losing.drive(governor, 20)
    assert not governor.active
    assert one_losing.drive(governor, 200, kept_a_row=0.0).count(True) == 0
