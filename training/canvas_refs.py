"""The compositor's references as a world canvas serves them (issue 38, item 5).

Serving on a canvas (``model/default/reference/canvas/ground.py``) hands the causal model, every frame, the
ground under the view decoded from the canvas's codes: colours and a mask of ones, never the
model's own earlier frame. The committed weights learnt their reference from anchors (an
earlier frame of the sequence moved by the camera), so on a canvas they meet a reference they
were never trained on. ``CanvasReferences`` makes the training sequence's references the way
the canvas does: each frame's ground alone (``World.render_ground``, recorded with the batch)
encoded to ground codes and decoded under the frame's scene by the shipped ground tokenizer,
at the tokenizer's scale (64 px a view) and resampled to the batch's bucket, as serving
samples its decoded tiles. The first frame has none: serving commits a session's first frame
without a reference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.default.reference.canvas.ground import VIEW_UNITS
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS as TOKENIZER
from worldserve.model.default.reference.canvas.tokenizer import GroundTokenizer, load_tokenizer

CHUNK = 64  # views through the tokenizer per pass (bounds the activations' memory)


class CanvasReferences:
    def __init__(self, tokenizer: GroundTokenizer, device: torch.device):
        self.tokenizer = tokenizer.to(device).float().eval().requires_grad_(False)
        self.device = device

    @classmethod
    def load(cls, device: torch.device) -> CanvasReferences:
        """The shipped ground tokenizer (``model/default/weights/``), the one serving decodes with."""
        return cls(load_tokenizer(TOKENIZER), device)

    @torch.no_grad()
    def __call__(self, grounds: np.ndarray, scenes: np.ndarray) -> torch.Tensor:
        """``grounds`` (B, N, H, W, 3) uint8, ``scenes`` (B, N, S) -> references (B, N, 4, H, W)
        float32 on the device: the round trip's colours in [-1, 1] and a mask of ones; frame 0
        all zeros (no reference)."""
        b, n, h, w, _ = grounds.shape
        if h != w or scenes.shape[:2] != (b, n):
            raise ValueError(f"grounds {grounds.shape} and scenes {scenes.shape} do not match")
        views = torch.from_numpy(np.ascontiguousarray(grounds[:, 1:])).to(self.device)
        x = views.reshape(-1, h, w, 3).permute(0, 3, 1, 2).float() / 127.5 - 1
        if h != VIEW_UNITS:  # the tokenizer's scale: one pixel a world unit
            x = F.interpolate(x, size=(VIEW_UNITS, VIEW_UNITS), mode="area" if h > VIEW_UNITS else "bilinear")
        sc = torch.from_numpy(np.ascontiguousarray(scenes[:, 1:], np.float32)).to(self.device).reshape(len(x), -1)
        tok = self.tokenizer
        out = torch.cat([tok.decode(tok.encode(x[i : i + CHUNK]), sc[i : i + CHUNK]) for i in range(0, len(x), CHUNK)])
        if h != VIEW_UNITS:
            out = F.interpolate(out, size=(h, w), mode="bilinear", align_corners=False)
        out = out.clamp(-1, 1).view(b, n - 1, 3, h, w)
        ref = torch.cat((out, torch.ones_like(out[:, :, :1])), 2)
        return torch.cat((torch.zeros_like(ref[:, :1]), ref), 1)
