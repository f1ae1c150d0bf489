"""Recall: new terrain at the view's edge drawn from windows of the sink frame, by a choice.

A clean-sample regressor draws what it cannot know as the mean of what might be there: the
terrain entering the view comes out as flat, token-sized blocks, and a long rollout is made
of nothing else. Recall makes that part of the frame a choice instead of an average. Every
sub-patch (``ModelConfig.recall_patch`` pixels a side) that holds pixels the camera brings
into view picks one window of the session's sink frame (a frame of the real world: the
observation the epoch started from), and those pixels are copied from it:

    sink frame (H, W)                      new frame (H, W), camera moving right
    +----------------+                     +------------+---+
    | [w0] [w1] ...  |  candidates: every  |  carried   | n |  n: pixels whose source lies
    |   windows s x s,  stride 2 px        |  (warp,    | e |     outside the previous frame
    |   keys  k = K(pixels)                |   anchor)  | w |     (the camera's shift)
    +----------------+                     +------------+---+
                                           sub-patch query q = Q_tok(token) + Q_pix(known pixels)
                                           p(window) = softmax(q . k / sqrt(d)); one is drawn

Training is classification: the label of a sub-patch is the window nearest to the renderer's
frame there (over the whole sub-patch, so the pixels already in view weigh most: the
choice that continues them wins), and the loss is the cross-entropy. A categorical draw
does not average: whatever window is drawn is real terrain of this world, as sharp as the
observation it came from. Serving draws it from the session's own noise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

STRIDE = 2  # pixels between candidate windows of the sink frame
DIM = 64  # query / key width
EDGE_SLACK = 0.5  # pixels a source may lie past the previous frame's edge and still count as carried
MATCH_START = 4.0  # log of the overlap term's initial scale: a mean squared difference of 0.02 scores -1.1


def new_pixels(shift: torch.Tensor, size: int) -> torch.Tensor:
    """Pixels the camera brings into view: shift (N, 2) the static scene's move (dy, dx) in
    pixels this frame -> (N, 1, size, size) bool, True where the source ``(y - dy, x - dx)``
    lies outside the previous frame by more than ``EDGE_SLACK`` (the warp can only replicate
    its edge there; a source less far out is mostly the edge pixel itself, and a camera at
    rest, whose estimated shift is a hair off zero, brings in nothing)."""
    pos = torch.arange(size, device=shift.device, dtype=torch.float32)
    dy, dx = shift[:, 0, None].float(), shift[:, 1, None].float()
    lo, hi = -EDGE_SLACK, size - 1 + EDGE_SLACK
    rows = ((pos - dy) < lo) | ((pos - dy) > hi)  # (N, H)
    cols = ((pos - dx) < lo) | ((pos - dx) > hi)  # (N, W)
    return (rows[:, :, None] | cols[:, None, :])[:, None]


def uniforms(noise: torch.Tensor, s: int) -> torch.Tensor:
    """One uniform in (0, 1) per sub-patch from standard normal noise (N, C, H, W): its first
    channel at each sub-patch's corner through the normal CDF -> (N, (H/s) * (W/s))."""
    z = noise[:, 0, ::s, ::s].float().flatten(1)
    return 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))


class Recall(nn.Module):
    """The query, key and choice of ``recall_patch``-sized sub-patches (one module for every
    bucket: the sub-patch is the same number of pixels at each)."""

    def __init__(self, width: int, channels: int, patch: int, sub: int):
        super().__init__()
        self.sub, self.per_side = sub, patch // sub
        self.token_query = nn.Linear(width, self.per_side**2 * DIM)
        self.pixel_query = nn.Linear((channels + 1) * sub * sub, DIM)
        self.key = nn.Linear(channels * sub * sub, DIM)
        self.match_scale = nn.Parameter(torch.zeros(()))  # log scale of the overlap term

    def reset_parameters(self) -> None:
        for m in (self.token_query, self.pixel_query, self.key):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        nn.init.constant_(self.match_scale, MATCH_START)

    def candidates(self, sink: torch.Tensor) -> torch.Tensor:
        """Every s x s window of the sink frames (N, C, H, W) at ``STRIDE`` -> (N, K, C*s*s)."""
        return F.unfold(sink.float(), self.sub, stride=STRIDE).transpose(1, 2)

    def logits(self, tokens: torch.Tensor, guess: torch.Tensor, new: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """Scores of every window for every sub-patch: tokens (N, T, W) the head's normed
        tokens; guess (N, C, H, W) the frame drawn so far; new (N, 1, H, W) bool; cand
        (N, K, C*s*s) -> (N, S, K), S sub-patches in raster order. The score is a learned
        match (the token's and the known pixels' query against the window's key) minus,
        scaled, the mean squared difference between the window and the pixels already in
        view where they overlap: the window that continues the view scores high from the
        start (texture synthesis by non-parametric sampling, Efros & Leung), and the learned
        part adds what the scene and the tokens know."""
        q, parts = self._queries(tokens, guess, new)
        return self._scores(q, parts, cand)

    def fill(
        self, x0: torch.Tensor, tokens: torch.Tensor, shift: torch.Tensor, shown: torch.Tensor,
        sink: torch.Tensor, ok: torch.Tensor, u: torch.Tensor,
    ) -> torch.Tensor:
        """Serving's step after the last denoising forward: the guesses x0 (B, F, C, H, W)
        with the ground the camera brings into view drawn from each session's sink frame.
        tokens (B, F*T, W) the last forward's final tokens; shift (B, F, 2) the model's camera
        shift; shown (B, F, 1, H, W) the anchor reference's mask (no drawing where it shows
        the ground); sink (B, C, H, W) and ok (B,) bool, whether it may be drawn from; u
        (B*F, S) the uniforms of the draw."""
        b, f, _, h, _ = x0.shape
        new = new_pixels(shift.flatten(0, 1), h) & ok.repeat_interleave(f)[:, None, None, None]
        new &= shown.flatten(0, 1) <= 0.5
        return self.choose(tokens.view(b * f, -1, tokens.shape[-1]), x0.flatten(0, 1), new,
                           self.candidates(sink.repeat_interleave(f, 0)), u).view_as(x0)

    def choose(self, tokens: torch.Tensor, guess: torch.Tensor, new: torch.Tensor, cand: torch.Tensor,
               u: torch.Tensor) -> torch.Tensor:
        """Serving's draw: ``guess`` with its new pixels pasted from windows drawn by the
        uniforms u (N, S), scored as ``logits`` does but only for the sub-patches that hold
        new pixels (at most the frame's rim), none at all when the camera is at rest."""
        touched = self.touched(new)  # (N, S)
        m = int(touched.sum(1).max())
        if m == 0:
            return guess
        sel = torch.argsort((~touched).to(torch.uint8), dim=1, stable=True)[:, :m]  # touched ones first
        q, parts = self._queries(tokens, guess, new)
        q = q.gather(1, sel[..., None].expand(-1, -1, q.shape[-1]))
        parts = parts.gather(1, sel[..., None].expand(-1, -1, parts.shape[-1]))
        idx = torch.zeros_like(touched, dtype=torch.long).scatter_(1, sel, draw(self._scores(q, parts, cand), u.gather(1, sel)))
        return self.paste(guess, new, cand, idx)  # rows padded in with untouched ones paste nothing

    def _queries(self, tokens: torch.Tensor, guess: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sub-patch's query (N, S, D) and its known pixels with the new-pixel mask
        (N, S, (C+1)*s*s)."""
        n, t, _ = tokens.shape
        g, r = math.isqrt(t), self.per_side
        q_tok = self.token_query(tokens.float()).view(n, g, g, r, r, DIM)
        q_tok = q_tok.permute(0, 1, 3, 2, 4, 5).reshape(n, g * r * g * r, DIM)  # sub-patch raster order
        known = torch.cat((guess.float() * ~new, new.float()), 1)  # what is in view, and where it is not
        parts = F.unfold(known, self.sub, stride=self.sub).transpose(1, 2)  # (N, S, (C+1)*s*s)
        return q_tok + self.pixel_query(parts), parts

    def _scores(self, q: torch.Tensor, parts: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """Queries (N, M, D) and known pixels (N, M, (C+1)*s*s) of M sub-patches against
        the windows (N, K, C*s*s) -> (N, M, K)."""
        learned = q @ self.key(cand).transpose(1, 2) / math.sqrt(DIM)
        c = cand.shape[-1] // (self.sub * self.sub)
        seen = (1.0 - parts[..., -self.sub * self.sub :]).repeat(1, 1, c)  # (N, M, C*s*s) 1 where in view
        vals = parts[..., : -self.sub * self.sub]  # zero where not in view
        # sum over the seen pixels of (v - c)^2 = sum v^2 - 2 v.c + seen.c^2
        sq = (vals * vals).sum(-1, keepdim=True) - 2 * vals @ cand.transpose(1, 2) + seen @ (cand * cand).transpose(1, 2)
        mse = sq / seen.sum(-1, keepdim=True).clamp_min(1.0)
        return learned - self.match_scale.exp() * mse

    def paste(self, guess: torch.Tensor, new: torch.Tensor, cand: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``guess`` (N, C, H, W) with its new pixels copied from the chosen windows: idx
        (N, S) one window per sub-patch."""
        h, w = guess.shape[-2:]
        chosen = cand.gather(1, idx[..., None].expand(-1, -1, cand.shape[-1]))  # (N, S, C*s*s)
        drawn = F.fold(chosen.transpose(1, 2), (h, w), self.sub, stride=self.sub)
        return torch.where(new, drawn.to(guess.dtype), guess)

    def labels(self, target: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """The window nearest to each sub-patch of ``target`` (N, C, H, W) -> (N, S)."""
        parts = F.unfold(target.float(), self.sub, stride=self.sub).transpose(1, 2)  # (N, S, C*s*s)
        dist = (cand * cand).sum(-1)[:, None] - 2 * parts @ cand.transpose(1, 2)  # |a|^2 is the same for every k
        return dist.argmin(-1)

    def touched(self, new: torch.Tensor) -> torch.Tensor:
        """(N, S) bool: sub-patches holding a new pixel."""
        return F.max_pool2d(new.float(), self.sub).flatten(1) > 0


def draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One window per sub-patch from ``softmax(logits)`` (N, S, K) by the uniforms u (N, S)."""
    cdf = logits.float().softmax(-1).cumsum(-1)
    return (cdf < u[..., None]).sum(-1).clamp_max(logits.shape[-1] - 1)


def recall_loss(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (N, S, K) against labels (N, S), averaged over the sub-patches of
    weight 1 (N, S); 0 where none counts."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view_as(weight)
    return (ce * weight).sum() / weight.sum().clamp_min(1.0)
