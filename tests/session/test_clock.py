"""Frame clocks: display times, due times, re-timing, pull deadlines."""

from __future__ import annotations

import pytest

from worldserve.session.clock import FrameClock, ManualClock, pull_due


def test_frame_n_is_displayed_at_t0_plus_n_over_fps() -> None:
    clk = FrameClock(t0=10.0, fps=24.0, frames_per_chunk=1)
    assert clk.frame_display(48) == pytest.approx(12.0)
    assert clk.display(24) == pytest.approx(11.0)


def test_a_chunk_of_f_frames_fills_one_slot_of_f_over_fps() -> None:
    clk = FrameClock(t0=0.0, fps=24.0, frames_per_chunk=3)
    assert clk.chunk_period == pytest.approx(0.125)
    assert clk.display(2) == pytest.approx(clk.frame_display(6))


def test_lookahead_makes_a_chunk_due_l_periods_before_display() -> None:
    clk = FrameClock(t0=1.0, fps=10.0, frames_per_chunk=2, lookahead=2)
    assert clk.due(5) == pytest.approx(clk.display(5) - 2 * 0.2)
    clk.lookahead = 0  # cutting lookahead refunds its slack at once
    assert clk.due(5) == pytest.approx(clk.display(5))


def test_retime_keeps_the_slot_display_time_and_spaces_later_slots_by_the_new_period() -> None:
    clk = FrameClock(t0=0.0, fps=24.0, frames_per_chunk=1)
    at = clk.display(10)
    clk.retime(10, 12.0)
    assert clk.display(10) == pytest.approx(at)
    assert clk.display(12) == pytest.approx(at + 2 / 12)


def test_slot_at_and_slots_displayed_count_slots_from_zero() -> None:
    clk = FrameClock(t0=5.0, fps=10.0, frames_per_chunk=1)
    assert clk.slot_at(5.0) == 0
    assert clk.slot_at(5.01) == 1
    assert clk.slot_at(clk.display(7)) == 7
    assert clk.slots_displayed(4.9) == 0
    assert clk.slots_displayed(5.0) == 1
    assert clk.slots_displayed(5.35) == 4


def test_bad_clock_parameters_are_rejected() -> None:
    with pytest.raises(ValueError, match="fps"):
        FrameClock(0.0, 0.0, 1)
    with pytest.raises(ValueError, match="lookahead"):
        FrameClock(0.0, 24.0, 1, lookahead=-1)


def test_pull_block_is_due_at_request_time_plus_deadline_or_default() -> None:
    assert pull_due(3.0, 0.5, default=0.1) == 3.5
    assert pull_due(3.0, None, default=0.1) == pytest.approx(3.1)
    with pytest.raises(ValueError):
        pull_due(3.0, -1.0, default=0.1)


def test_manual_clock_moves_only_forward_when_told() -> None:
    clk = ManualClock(2.0)
    clk.advance(0.5)
    clk.set(1.0)
    assert clk() == 2.5
    with pytest.raises(ValueError):
        clk.advance(-1)
