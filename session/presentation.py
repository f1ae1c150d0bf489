"""The presentation clock of an epoch: what ``frame.pts_us`` counts (docs/protocol.md, "Time").

One rule for every model family and both modes: an epoch's first frame is at 0, and each
frame after it is one frame period (``1e6 / fps`` at the rate its block was made at) after
the frame before it, later only by the display frames a ``skipped`` announced right before
its block. Nothing else moves it: a detach, a resume, a takeover or a migration pauses the
clock with generation, so the first frame generated after one is one period after the last
frame generated before it. The clock is kept beside the session's other facts and travels
with a hand-off (session/handoff.py), so another worker continues it.

Pacing is separate: push frames are handed over on the scheduler's frame clock, which a
pause moves on; ``pts_us`` is where a player puts a frame on its own timeline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Presentation:
    """Where the next frame of the epoch goes: epoch frame index ``frame`` at ``us``."""

    frame: int = 0
    us: float = 0.0

    def at(self, first_frame: int, step_us: float) -> float:
        """The presentation time of epoch frame ``first_frame`` if nothing is skipped before
        it (a frame after the next one, after a gap, counts the frames between)."""
        return self.us + (first_frame - self.frame) * step_us

    def place(self, block_idx: int, first_frame: int, frames: int, step_us: float, late: int = 0) -> int:
        """Place a block of ``frames`` frames made at ``step_us`` per frame, ``late`` display
        frames after its slot (push ``skipped``); returns its first frame's ``pts_us``."""
        if block_idx == 0:  # a new epoch starts the clock at 0
            start = 0.0
        else:
            start = self.at(first_frame, step_us) + late * step_us
        self.frame, self.us = first_frame + frames, start + frames * step_us
        return round(start)
