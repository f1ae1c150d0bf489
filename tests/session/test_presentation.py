"""The epoch's presentation clock (session/presentation.py): one period a frame at the rate a
block was made at, later only by skipped display frames, and a pause moves nothing."""

from __future__ import annotations

from worldserve.session.presentation import Presentation


def test_frames_follow_one_period_apart_and_a_skip_moves_the_next_block_later() -> None:
    clock = Presentation()
    step = 1e6 / 24
    assert clock.place(0, 0, 1, step) == 0
    assert clock.place(1, 1, 1, step) == round(step)
    assert clock.place(2, 2, 1, step, late=2) == round(4 * step)  # two display slots skipped
    assert clock.place(3, 3, 1, step) == round(5 * step)


def test_a_rate_change_counts_each_block_at_the_rate_it_was_made_at() -> None:
    clock = Presentation()
    clock.place(0, 0, 4, 1e6 / 16)  # four frames at 16 fps: the next at 250 ms
    assert clock.place(1, 4, 4, 1e6 / 8) == 250_000
    assert clock.place(2, 8, 4, 1e6 / 8) == 750_000


def test_a_new_epoch_starts_at_zero_and_a_gap_counts_the_frames_between() -> None:
    clock = Presentation()
    clock.place(0, 0, 5, 1e6 / 16)
    clock.place(1, 5, 8, 1e6 / 16)
    assert clock.at(21, 1e6 / 16) == 21 * 62_500  # a crash restore that goes on two blocks later
    assert clock.place(0, 0, 5, 1e6 / 16) == 0
