"""The canvas: a session's memory of the ground it has seen, by world position, written once.

The anchor reference (``model/anchor.py``) is one frame moved by the camera's summed shift.
Once the camera leaves it, the serving path re-anchors on its newest frame, and the ground
that entered the view in between was carried only by the per-frame warp, which softens it a
little every frame. With ``ModelConfig.canvas_memory`` the reference comes from a canvas
instead: every pixel of ground is written the first time a frame shows it (resampled once
to the canvas grid) and read from there on (resampled once more), so it stays as it was
first drawn however long the session runs, and a place the camera comes back to looks as it
did.

The canvas is a torus of ``CANVAS_SPAN`` frames a side; each cell also keeps which tile of
the world (a ``side x side`` square) it holds, so a cell that the camera has since carried
far away is read as unseen, never as another place's ground:

    world (unbounded)                  canvas (side x side, side = CANVAS_SPAN * frame)
    ... | tile (0,0) | tile (0,1) | ...     cell (y mod side, x mod side) holds the pixel and
    ... | tile (1,0) | tile (1,1) | ...     its tile (floor(y / side), floor(x / side))

World coordinates follow the anchor's convention: frame pixel (y, x) at summed shift
(dy, dx) shows world point (y - dy, x - dx).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CANVAS_SPAN = 4  # canvas side in frame sides
UNSEEN = -(2**62)  # the tile of a cell never written
# a cell is drawn again where the newest frame differs from it by more than this (in [-1, 1]
# units, ~19 of 255): things that moved, weather, a view the model has re-drawn. Below it the
# cell keeps its first drawing, and the per-frame warp's softening never reaches it.
REDRAW = 0.15


@dataclass(slots=True)
class Canvas:
    pixels: torch.Tensor  # (C, side, side) model floats
    tile: torch.Tensor  # (2, side, side) int64: the world tile (ty, tx) each cell holds, UNSEEN if none

    @classmethod
    def blank(cls, channels: int, frame: int, dtype: torch.dtype, device: torch.device) -> Canvas:
        side = CANVAS_SPAN * frame
        return cls(torch.zeros(channels, side, side, dtype=dtype, device=device),
                   torch.full((2, side, side), UNSEEN, dtype=torch.int64, device=device))

    @property
    def side(self) -> int:
        return self.pixels.shape[-1]

    def read(self, offset: torch.Tensor, size: int) -> torch.Tensor:
        """The ground a ``size``-pixel frame at summed shift ``offset`` (2,) shows, bilinear,
        and where the canvas has it: (C + 1, size, size) as ``anchor_reference`` gives (zero
        where unseen, then a mask channel)."""
        ys, fy = _split(torch.arange(size + 1, device=offset.device, dtype=torch.float64) - offset[0].double())
        xs, fx = _split(torch.arange(size + 1, device=offset.device, dtype=torch.float64) - offset[1].double())
        fy, fx = fy[:1], fx[:1]  # one fraction for the whole frame: the shift is the same everywhere
        cy, ty = _cell(ys, self.side)  # the (size + 1)^2 block of cells the samples fall between
        cx, tx = _cell(xs, self.side)
        block = self.pixels[:, cy[:, None], cx[None, :]].float()  # (C, size + 1, size + 1)
        has = (self.tile[0][cy[:, None], cx[None, :]] == ty[:, None]) & (self.tile[1][cy[:, None], cx[None, :]] == tx[None, :])
        wy, wx = fy[:, None], fx[None, :]
        out = ((1 - wy) * ((1 - wx) * block[:, :-1, :-1] + wx * block[:, :-1, 1:])
               + wy * ((1 - wx) * block[:, 1:, :-1] + wx * block[:, 1:, 1:]))
        # a corner counts only where its weight is not zero
        ok_y0, ok_y1 = has[:-1] | (fy == 1), has[1:] | (fy == 0)
        seen = (ok_y0[:, :-1] | (fx == 1)) & (ok_y0[:, 1:] | (fx == 0)) & (ok_y1[:, :-1] | (fx == 1)) & (ok_y1[:, 1:] | (fx == 0))
        mask = seen[None].float()
        return torch.cat((out * mask, mask)).to(self.pixels.dtype)

    def write(self, frame: torch.Tensor, offset: torch.Tensor) -> None:
        """Write the ground of ``frame`` (C, H, W) at summed shift ``offset`` (2,) where the
        canvas has none yet: every whole world point the frame covers, sampled from it
        bilinearly. What is already there stays as it was first drawn."""
        h = frame.shape[-1]
        oy, ox = float(offset[0]), float(offset[1])
        wy = torch.arange(_ceil(-oy), _floor(h - 1 - oy) + 1, device=frame.device)  # world rows in view
        wx = torch.arange(_ceil(-ox), _floor(h - 1 - ox) + 1, device=frame.device)
        if not len(wy) or not len(wx):
            return
        cy, ty = _cell(wy, self.side)
        cx, tx = _cell(wx, self.side)
        fresh = (self.tile[0][cy[:, None], cx[None, :]] != ty[:, None]) | (
            self.tile[1][cy[:, None], cx[None, :]] != tx[None, :])
        vals = _sample(frame, wy.double() + oy, wx.double() + ox)  # (C, len(wy), len(wx))
        held = self.pixels[:, cy[:, None], cx[None, :]].float()
        fresh |= (vals - held).abs().amax(0) > REDRAW  # the view has changed here: follow it
        if not bool(fresh.any()):
            return
        gy, gx = cy[:, None].expand_as(fresh)[fresh], cx[None, :].expand_as(fresh)[fresh]
        self.pixels[:, gy, gx] = vals[:, fresh].to(self.pixels.dtype)
        self.tile[0, gy, gx] = ty[:, None].expand_as(fresh)[fresh]
        self.tile[1, gy, gx] = tx[None, :].expand_as(fresh)[fresh]


def _split(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (float64) -> whole part (int64) and fraction (float32)."""
    whole = pos.floor()
    return whole.long(), (pos - whole).float()


def _cell(pos: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """World positions (int64) -> canvas cell and world tile."""
    return pos.remainder(side), torch.div(pos, side, rounding_mode="floor")


def _ceil(v: float) -> int:
    return int(-((-v) // 1))


def _floor(v: float) -> int:
    return int(v // 1)


def _sample(frame: torch.Tensor, ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """``frame`` (C, H, W) at fractional rows ``ys`` and columns ``xs`` inside it, bilinear."""
    h = frame.shape[-1]
    y0, fy = _split(ys)
    x0, fx = _split(xs)
    y1, x1 = (y0 + 1).clamp_max(h - 1), (x0 + 1).clamp_max(h - 1)
    f = frame.float()
    top = f[:, y0[:, None], x0[None, :]] * (1 - fx) + f[:, y0[:, None], x1[None, :]] * fx
    bottom = f[:, y1[:, None], x0[None, :]] * (1 - fx) + f[:, y1[:, None], x1[None, :]] * fx
    return top * (1 - fy[:, None]) + bottom * fy[:, None]
