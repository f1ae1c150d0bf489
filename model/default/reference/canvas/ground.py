"""The world canvas in serving: each session's ground codes, drawn as the causal model's
reference every frame (issue 38).

``GroundPainter`` (one per runner: the tokenizer, the prior's bank) keeps a ``SessionGround``
per session: its ``Canvas`` of codes, the camera's place on it (the view's top-left corner in
world units, moved by the shift the model's shift head gives each frame) and the pixels of the
tiles it has decoded under the session's scene. For each frame it hands the runner the ground
under the camera as the reference (``anchor_reference``'s layout: colours and a mask of ones):

1. the tiles the view overlaps, and one tile around them, are filled where empty by the prior
   (``quilt.fill_tile``), in row order;
2. each tile the view overlaps is decoded once (``GroundTokenizer.decode``, with ``MARGIN``
   codes of its neighbours around it so that tiles meet without seams) and kept; a prompt
   change re-decodes under the new scene: the same place, re-skinned;
3. the view is sampled from those pixels (sharpened once decoded: ``tile_decode.sharpen``),
   bilinear, at the frame's bucket, as the renderer samples its ground.

Ahead of the camera: once a chunk is made (``moved``), and after an observation, a prompt
change or a restore, the painter queues on its ``TileDecoder``'s thread the fills of ``AHEAD +
1`` rings of tiles around the view's, then the decodes of the ring of ``AHEAD`` tiles, which
that thread does in the gaps between chunks. The model thread takes back what it needs before
the thread got to it (``Job.take``). Fills run in a fixed order whichever thread runs them, and
a decode depends only on codes already written (the tile and its neighbours, all filled by
then), so the canvas and the pixels are the ones inline work would give: ahead or not, replays
and migrated sessions see the same ground.

A session a server opens on the start frame it asked the runner for (``ModelRunner.first_frame``,
on a worker thread), or on a client's observation, gets its ground made there too (``ready``:
the view's codes encoded there; the fills, and the tiles the view reaches in its first half
tile of travel, done by the decoder's thread while that worker waits), so the model thread
opens it with nothing to encode, fill or decode (``start_views.py``).

A prompt that changes the look codes carry (biome, vegetation or weather) starts the canvas
anew (``rescene``).

An observation (the start frame's ground, or a client's ``observation``) is encoded (a seen
frame by the observation encoder, ``observer.py``, where one ships; the ground alone by the
tokenizer's) and written where it lies, over the prior's codes; its pixels are kept there too
(``seen.py``) and laid over the decode, so a session starts on the very frame it was given
and comes back to it, where the codes alone draw it softer and lose what they cannot spell.

``RADIUS`` is half the torus, so nothing a session has seen is evicted: its canvas holds at
most the torus's 256 tiles of codes (128 KB), the pixels of the 16 tiles around the view
(768 KB in fp32), the view's 2 x 2 tiles blended (192 KB, kept while the view stays on
them) and the pixels observations left (16 KB a tile, at most four tiles an observation; 4 MB
were the whole torus observed). A nearer radius lost places a camera
comes back to: 3 s away with a key held and the mouse drifting goes past 192 units on an axis
(5 of the 12 revisits of ``bench.quality``).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import CancelledError
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.default.reference.canvas import seen as seen_px
from worldserve.model.default.reference.canvas.canvas import (
    CODE_UNITS,
    EMPTY,
    MISSING,
    TILE,
    TILE_UNITS,
    Canvas,
)
from worldserve.model.default.reference.canvas.observer import (
    OBSERVER,
    load_observer,
    observed_codes,
)
from worldserve.model.default.reference.canvas.quilt import (
    BANK,
    GroundBank,
    fill_tile,
    look_key,
    similarity,
)
from worldserve.model.default.reference.canvas.state import CanvasState
from worldserve.model.default.reference.canvas.tile_decode import (
    BLEND,
    MARGIN,
    SHARPEN,
    Job,
    TileDecoder,
)
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS as TOKENIZER
from worldserve.model.default.reference.canvas.tokenizer import (
    Encoder,
    GroundTokenizer,
    load_tokenizer,
)
from worldserve.world.scene import SceneAttrs, parse_prompt

VIEW_UNITS = TILE_UNITS  # world units a view covers at every bucket
MAP_SIZE = 1024  # the canvas's torus, world units per side (the training worlds' size)
RADIUS = MAP_SIZE / 2  # tiles whose centre lies farther from the camera (on an axis) are evicted: none
AHEAD = 1  # rings of tiles around the view's decoded before the view reaches them
READY_REACH = TILE_UNITS / 2  # units of travel whose tiles ``ready`` waits for (a second or so with a key held)
READY_WAIT = 0.5  # seconds ``ready`` waits for the decoder's thread before leaving the rest to the model thread
TRUST = 4.0  # the served canvas's reference trust (``ModelConfig.reference_trust``; docs/model.md)


@dataclass(slots=True)
class SessionGround:
    _canvas: Canvas  # read and written through ``canvas``, once the fills under way are done
    seed: int  # the prior's draws (``quilt.fill_tile``)
    position: np.ndarray  # (2,) float64: the view's top-left (y, x), world units, on the torus
    look: SceneAttrs  # the session's scene: which of the bank's looks new ground is drawn from
    pixels: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # tile -> (3, 80, 80): BLEND around
    ahead: dict[tuple[int, int], Job[torch.Tensor]] = field(default_factory=dict)  # tile -> its decode
    pending: np.ndarray | None = None  # the position after the chunk being made
    filling: Job[None] | None = None  # ``GroundPainter.prepare``'s fills, queued or under way on the decoder's thread
    seen: seen_px.Seen = field(default_factory=dict)  # tile -> the observed pixels laid over its decode (``seen.py``)
    seen_version: int = 0  # counts the changes to ``seen``
    # the last 2 x 2 tiles blended (``_raster``): their corner tile, seen_version, pixels, raster
    raster: tuple[tuple[int, int, int], tuple[torch.Tensor, ...], torch.Tensor] | None = None
    # the view's tiles last found whole (``_fill_around``): canvas, its changes, corner tile, rings
    whole: tuple[Canvas, int, int, int, int] | None = None

    @property
    def canvas(self) -> Canvas:
        self.settle()
        return self._canvas

    @canvas.setter
    def canvas(self, canvas: Canvas) -> None:
        self.settle()
        self._canvas = canvas

    def settle(self) -> None:
        """Finish the fills queued (here) or under way (waiting for them): until then the
        decoder's thread owns the canvas, ``pixels`` and ``ahead``."""
        if self.filling is not None:
            pending, self.filling = self.filling, None
            pending.take()

    def to_state(self) -> CanvasState:
        keys, codes = self.canvas.to_arrays()
        seen_keys, seen = seen_px.to_arrays(self.seen)
        return CanvasState(keys=keys, codes=codes, position=self.position.copy(), seed=self.seed,
                           seen_keys=seen_keys, seen=seen)


class GroundPainter:
    def __init__(self, tokenizer: GroundTokenizer, bank: GroundBank, device: torch.device, ahead: bool = True,
                 dtype: torch.dtype = torch.float32, beside_chunks: bool = False, observer: Encoder | None = None,
                 sharpen: float = SHARPEN, keep_seen: bool = True):
        """``ahead``: decode tiles ahead of the camera on the decoder's own thread (False:
        every decode inline, on the thread that needs it). ``dtype``: the decodes' (the
        runner's); the tokenizer's encoder, which picks codes, always runs in float32.
        ``beside_chunks``: the decoder's thread works during chunks too (``TileDecoder``).
        ``observer``: the observation encoder (``observer.py``; None: the tokenizer's encoder).
        ``sharpen``: the unsharp mask on every decoded tile (``tile_decode.sharpen``).
        ``keep_seen``: an observation's pixels are kept and laid over the decode where they
        lie (``seen.py``; False: its codes alone)."""
        self.keep_seen = keep_seen
        self.ready_wait = READY_WAIT  # seconds ``ready`` waits for the decoder's thread
        self.tokenizer = tokenizer.to(device).float().eval()
        self.observer = observer.to(device).float().eval() if observer is not None else None
        self.bank = bank
        self.device = device
        self.table = tokenizer.quantizer.table().detach().float().cpu().numpy()  # (K, D)
        self.sim = similarity(self.table)  # (K, K): the prior's agreement lookups
        self.decoder = TileDecoder(self.tokenizer, device, background=ahead, dtype=dtype, beside_chunks=beside_chunks,
                                   sharpen=sharpen)

    @classmethod
    def load(cls, device: torch.device, tokenizer: Path = TOKENIZER, bank: Path = BANK,
             ahead: bool = True, dtype: torch.dtype = torch.float32, beside_chunks: bool = False,
             observer: Path | None = OBSERVER, sharpen: float = SHARPEN) -> GroundPainter:
        """The shipped ground tokenizer, bank and observation encoder (``model/default/weights/``;
        the last where there is one that learnt this tokenizer's codes; ``observer=None``: none)."""
        tok = load_tokenizer(tokenizer)
        obs = load_observer(observer, tok) if observer is not None else None
        return cls(tok, GroundBank.load(bank), device, ahead, dtype, beside_chunks, obs, sharpen)

    def busy(self) -> AbstractContextManager[None]:
        """Around a chunk: the decoder's thread starts no work inside it (``TileDecoder.busy``)."""
        return self.decoder.busy()

    def close(self) -> None:
        """Stop the decoder's thread (decodes still queued are dropped)."""
        self.decoder.close()

    def start(self, seed: int, look: SceneAttrs) -> SessionGround:
        """A new session's ground, its view on tile (0, 0) exactly (an observation there is
        one tile of codes, which the prior goes on from at the tile's edges)."""
        return SessionGround(Canvas(MAP_SIZE, RADIUS), seed, np.zeros(2, np.float64), look)

    def restore(self, st: CanvasState, look: SceneAttrs) -> SessionGround:
        if st.position.shape != (2,) or not np.isfinite(st.position).all():
            raise ValueError(f"canvas position {st.position} must be two finite numbers")
        if int(st.codes[st.codes != EMPTY].max(initial=0)) >= len(self.table):
            raise ValueError(f"canvas codes reach past the tokenizer's {len(self.table)}")
        canvas = Canvas.from_arrays(MAP_SIZE, RADIUS, st.keys, st.codes)
        g = SessionGround(canvas, st.seed, np.asarray(st.position, np.float64) % MAP_SIZE, look)
        if st.seen is not None and st.seen_keys is not None:
            g.seen = seen_px.from_arrays(st.seen_keys, st.seen, canvas.side)
        self.prepare(g)
        return g

    def ready(self, seed: int, look: SceneAttrs, frame: np.ndarray, seen: bool = False,
              wait: float | None = None) -> SessionGround:
        """A new session's ground from its first view (``start``, then ``observe``: ``frame``
        the ground alone under it, or with ``seen`` the view as seen), made on the calling
        thread before the session opens. The view's codes are encoded here; then this waits
        (up to ``wait`` seconds, by default ``ready_wait``, taking no work back) while the decoder's thread fills around
        them and decodes every tile the view reaches within ``READY_REACH`` units of travel,
        whichever way it goes: the view's 2 x 2 and, as it starts on a tile's edges, the
        ring's nearest (9 tiles). What is not done by then is done as for any session: by the
        model thread when a frame needs it. The ground is the one ``start`` and ``observe``
        give on any thread."""
        g = self.start(seed, look)
        self.observe(g, frame, seen=seen)
        return self._await_reach(g, wait)

    def ready_restore(self, st: CanvasState, look: SceneAttrs, wait: float | None = None) -> SessionGround:
        """``restore``, made on the calling thread before the session is restored, and waited
        for as ``ready`` waits: the tiles its view reaches within ``READY_REACH`` units of
        travel decoded (4 to 9). A tile's pixels follow from the codes alone: the session
        makes the same frames on it as on a canvas restored by the model thread."""
        return self._await_reach(self.restore(st, look), wait)

    def _await_reach(self, g: SessionGround, wait: float | None) -> SessionGround:
        """Wait (up to ``wait`` seconds, by default ``ready_wait``) for ``g``'s fills and the
        decodes of the tiles within ``READY_REACH`` of its view, taking no work back."""
        end = time.monotonic() + (self.ready_wait if wait is None else wait)
        try:
            if g.filling is not None:
                g.filling.future.result(max(0.0, end - time.monotonic()))
            g.settle()
            for key in _reached(g.position, READY_REACH, g._canvas.side):
                job = g.ahead.get(key)
                if job is not None:
                    job.future.result(max(0.0, end - time.monotonic()))
        except (TimeoutError, CancelledError):
            pass  # left to the model thread (a saturated model leaves the decoder's thread no gaps)
        return g

    def ready_scene(self, scene: str, seed: int, frame: np.ndarray, seen: bool = False) -> SessionGround:
        """``ready`` for a scene prompt (``StartViews``'s hook)."""
        return self.ready(seed, parse_prompt(scene), frame, seen)

    # --- writes ---

    def release(self, g: SessionGround) -> None:
        """The session is gone: its work still queued on the decoder's thread is dropped (its
        fills, and decodes nobody will look at, would hold up live sessions' tiles), work under
        way is let finish, and its pixels go."""
        if g.filling is not None:
            pending, g.filling = g.filling, None
            if not pending.future.cancel():
                pending.future.result()  # under way: it may still queue decodes, dropped below
        for job in g.ahead.values():
            job.future.cancel()
        _forget_pixels(g)

    @torch.inference_mode()
    def observe(self, g: SessionGround, frame: np.ndarray, seen: bool = True) -> None:
        """Write what ``frame`` ((H, W, 3) uint8, the view at the session's place) shows into the
        canvas: its codes on the code grid, over what the prior drew there. ``seen``: the frame
        as seen (actors and weather on the ground: the observation encoder's), else the
        ground alone (the tokenizer's own encoder)."""
        g.settle()
        x = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None].float().to(self.device) / 127.5 - 1
        if x.shape[-1] != VIEW_UNITS:
            x = F.interpolate(x, size=(VIEW_UNITS, VIEW_UNITS), mode="area" if x.shape[-1] > VIEW_UNITS else "bilinear")
        view = x
        # move the view onto the code grid: the first whole code at or after its corner
        first = np.ceil(g.position / CODE_UNITS) * CODE_UNITS
        shift = first - g.position  # [0, CODE_UNITS) units
        if shift.any():
            x = _sample(x, float(shift[0]), float(shift[1]), VIEW_UNITS, VIEW_UNITS, 1.0)
        codes = observed_codes(self.tokenizer, self.observer if seen else None, x)[0].cpu().numpy().astype(np.int64)
        if shift[0]:
            codes[-1] = MISSING  # reaches past the view
        if shift[1]:
            codes[:, -1] = MISSING
        g.canvas.paste((float(first[0]), float(first[1])), codes)
        if self.keep_seen:
            self._keep_seen(g, view)
        _forget_pixels(g)  # tiles near it were decoded with the old codes
        self.prepare(g)

    def _keep_seen(self, g: SessionGround, view: torch.Tensor) -> None:
        """Keep ``view`` ((1, 3, VIEW_UNITS, VIEW_UNITS) in [-1, 1], at the session's place)
        on the canvas's pixel grid (``seen.py``): moved onto the first whole unit at or after
        its corner, its last row or column dropped where that moved it."""
        first = np.ceil(g.position)
        shift = first - g.position  # [0, 1) units
        if shift.any():
            view = _sample(view, float(shift[0]), float(shift[1]), VIEW_UNITS, VIEW_UNITS, 1.0)
        h, w = VIEW_UNITS - int(shift[0] > 0), VIEW_UNITS - int(shift[1] > 0)
        rgb = ((view[0, :, :h, :w].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
        seen_px.paste(g.seen, (int(first[0]), int(first[1])), rgb, seen_px.feathered(h, w), g._canvas.side)
        g.seen_version += 1

    def rescene(self, g: SessionGround, look: SceneAttrs) -> None:
        """A new prompt. Where it keeps the look codes carry (biome, vegetation, weather), the
        same codes are decoded under the new scene from now on: the same place re-skinned, as
        the tokenizer was trained to. Where it changes that look, the decoder never paired the
        old codes with the new one (they decode as blocks): the canvas starts anew at the
        camera's place, drawn by the prior from the new look's maps."""
        g.settle()
        _forget_pixels(g)
        g.seen.clear()  # the old look's pixels: the codes re-skin the place
        g.seen_version += 1
        if look_key(look) != look_key(g.look):
            g.canvas = Canvas(MAP_SIZE, RADIUS)
        g.look = look
        self.prepare(g)

    # --- the reference ---

    def references(self, grounds: list[SessionGround], shifts: np.ndarray, bucket: int) -> torch.Tensor:
        """A chunk's references (B, F, 4, bucket, bucket) for sessions whose static scene moves
        by ``shifts`` (B, F, 2) pixels a frame (the camera the opposite way); each session's
        place after the chunk waits in ``pending`` until ``moved``."""
        out = []
        for g, shift in zip(grounds, shifts, strict=True):
            tops = g.position - np.cumsum(shift.astype(np.float64), 0) * (VIEW_UNITS / bucket)
            g.pending = tops[-1]
            out.append(self.reference(g, tops, bucket))
        return torch.stack(out)

    @torch.inference_mode()
    def reference(self, g: SessionGround, tops: np.ndarray, bucket: int) -> torch.Tensor:
        """The ground under the view at each of ``tops`` ((F, 2) world units) as (F, 4, bucket,
        bucket) float32: colours in [-1, 1], then a mask of ones. Fills and decodes on the way."""
        g.settle()
        out = []
        for top in tops:
            self._fill_around(g, top)
            ty, tx = _corner(top)
            raster = _raster(g, ty, tx, [[self._tile_pixels(g, (ty + i, tx + j)) for j in (0, 1)] for i in (0, 1)])
            rel = top - np.array([ty, tx], np.float64) * TILE_UNITS
            out.append(_sample(raster[None], float(rel[0]), float(rel[1]), bucket, bucket, VIEW_UNITS / bucket)[0])
        ref = torch.stack(out).clamp(-1, 1)
        return torch.cat((ref, torch.ones_like(ref[:, :1])), 1)

    def moved(self, g: SessionGround) -> None:
        """The chunk was made: the camera is at its last frame's place; far tiles go."""
        if g.pending is None:
            return
        g.settle()
        g.position, g.pending = g.pending % MAP_SIZE, None
        g.canvas.evict((float(g.position[0]) + VIEW_UNITS / 2, float(g.position[1]) + VIEW_UNITS / 2))
        self.prepare(g)

    def prepare(self, g: SessionGround) -> None:
        """Get the ground ready around the camera, on the decoder's thread (``g.filling``):
        fill ``AHEAD + 1`` rings of tiles around the view's, then queue the decodes of the
        ``AHEAD`` ring's tiles that have no pixels yet, the view's first, then the ring's
        nearest the view first (a ring tile still queued when the view reaches it is queued
        again as the view's). Pixels outside that
        ring are forgotten now, and their decodes still queued dropped."""
        g.settle()
        top = g.position.copy()
        near = set(self._around(g, top, AHEAD))
        for key in [k for k in g.pixels if k not in near]:
            del g.pixels[key]
        for key in [k for k in g.ahead if k not in near]:
            g.ahead.pop(key).future.cancel()  # left behind: not decoded where still queued
        view = set(self._around(g, top, 0))
        centre = [float(t) + VIEW_UNITS / 2 for t in top]  # plain floats: sorted every chunk

        def reach(k: tuple[int, int]) -> float:
            """How far the view's centre is from tile ``k``'s (torus, the farther axis)."""
            d = [abs((i + 0.5) * TILE_UNITS - c) % MAP_SIZE for i, c in zip(k, centre, strict=True)]
            return max(min(a, MAP_SIZE - a) for a in d)

        # the view's tiles, then the nearest; tiles with pixels need nothing (most chunks: all)
        order = sorted((k for k in near if k not in g.pixels), key=lambda k: (k not in view, reach(k), k))

        def ready() -> None:
            self._fill_around(g, top, AHEAD + 1)
            scene = g.look.to_vector().astype(np.float32)
            for key in order:
                urgency = 1 + (key not in view)
                job = g.ahead.get(key)
                if job is not None and job.urgency > urgency and job.future.cancel():
                    del g.ahead[key]  # queued as the ring, now the view's: queued again ahead of the rings
                if key not in g.pixels and key not in g.ahead and self._decodable(g, key):
                    g.ahead[key] = self.decoder.submit(self._tile_codes(g, key), scene, urgency=urgency)

        g.filling = self.decoder.run(ready, urgency=0, fill=True)

    @staticmethod
    def _around(g: SessionGround, top: np.ndarray, rings: int) -> list[tuple[int, int]]:
        """The tiles of the view's 2 x 2 (from the one holding its corner: what ``reference``
        decodes) and ``rings`` around them, row by row."""
        side = g._canvas.side
        ty, tx = _corner(top)
        span = range(-rings, 2 + rings)
        return list(dict.fromkeys(((ty + i) % side, (tx + j) % side) for i in span for j in span))

    @staticmethod
    def _decodable(g: SessionGround, key: tuple[int, int]) -> bool:
        """Whether the tile and its 8 neighbours are written whole: its decode is then final."""
        side = g._canvas.side
        for i in (-1, 0, 1):
            for j in (-1, 0, 1):
                tile = g._canvas.tiles.get(((key[0] + i) % side, (key[1] + j) % side))
                if tile is None or (tile == EMPTY).any():
                    return False
        return True

    def _fill_around(self, g: SessionGround, top: np.ndarray, rings: int = 1) -> None:
        """Fill what is empty in ``_around``'s tiles, row by row from the top left. Tiles once
        whole stay whole until the canvas changes (``Canvas.changes``): while the view stays
        on the same tiles, nothing is looked at again."""
        canvas, corner = g._canvas, _corner(top)
        w = g.whole
        if w is not None and w[0] is canvas and w[1] == canvas.changes and w[2:4] == corner and w[4] >= rings:
            return
        maps = index = None
        for key in self._around(g, top, rings):
            tile = canvas.tiles.get(key)
            if tile is None or (tile == EMPTY).any():
                if maps is None:
                    maps, index = self.bank.for_scene(g.look), self.bank.sources(g.look)
                canvas.write(key, fill_tile(canvas, key, maps, self.sim, g.seed, index))
        g.whole = (canvas, canvas.changes, corner[0], corner[1], rings)

    def _tile_codes(self, g: SessionGround, key: tuple[int, int]) -> np.ndarray:
        size = TILE + 2 * MARGIN
        top = ((key[0] * TILE - MARGIN) * CODE_UNITS, (key[1] * TILE - MARGIN) * CODE_UNITS)
        return _fill_missing(g._canvas.crop(top, size * CODE_UNITS))

    def _tile_pixels(self, g: SessionGround, key: tuple[int, int]) -> torch.Tensor:
        side = g._canvas.side
        key = (key[0] % side, key[1] % side)
        px = g.pixels.get(key)
        if px is None:
            pending = g.ahead.pop(key, None)
            if pending is not None:  # queued (decoded here) or under way (moments off)
                px = pending.take()
            else:
                px = self.decoder.decode_now(self._tile_codes(g, key), g.look.to_vector().astype(np.float32))
            g.pixels[key] = px
        return px


def _corner(top: np.ndarray) -> tuple[int, int]:
    """The tile holding the view's top-left corner ``top`` (y, x world units): the first of
    the 2 x 2 tiles the view overlaps (not wrapped onto the torus)."""
    return math.floor(float(top[0]) / TILE_UNITS), math.floor(float(top[1]) / TILE_UNITS)


def _reached(top: np.ndarray, reach: float, side: int) -> list[tuple[int, int]]:
    """The tiles (on a torus of ``side``) a view from ``top`` overlaps after moving up to
    ``reach`` units (under that: a move of exactly ``reach`` onto an edge needs nothing more)
    any way, row by row."""
    lo = [math.floor((float(t) - reach) / TILE_UNITS + 1e-9) for t in top]
    hi = [math.ceil((float(t) + VIEW_UNITS + reach) / TILE_UNITS - 1e-9) for t in top]
    return [(i % side, j % side) for i in range(lo[0], hi[0]) for j in range(lo[1], hi[1])]


def _raster(g: SessionGround, ty: int, tx: int, tiles: list[list[torch.Tensor]]) -> torch.Tensor:
    """The 2 x 2 ``tiles`` from tile (``ty``, ``tx``) blended (``_blend``) with the seen pixels
    laid over them (``seen.compose``): kept, and given again while the view stays on the same
    tiles with the same pixels (a new decode is a new tensor) and the same seen pixels."""
    flat, mark = (tiles[0][0], tiles[0][1], tiles[1][0], tiles[1][1]), (ty, tx, g.seen_version)
    held = g.raster
    if held is not None and held[0] == mark and all(a is b for a, b in zip(held[1], flat, strict=True)):
        return held[2]
    side = g._canvas.side
    raster = seen_px.compose(_blend(tiles), g.seen, ty % side, tx % side, side)
    g.raster = (mark, flat, raster)
    return raster


def _forget_pixels(g: SessionGround) -> None:
    """Drop every decoded tile and every decode under way: the codes or the scene changed."""
    g.pixels.clear()
    g.ahead.clear()
    g.raster = None


def _ramps() -> tuple[torch.Tensor, torch.Tensor]:
    """``_blend``'s weights along an axis of the 2 x 2 raster (its margin included): the first
    tile's, 1 then down to 0 across the band about the edge, and the second's, the rest."""
    b, t = BLEND, TILE_UNITS
    u = torch.arange(2 * t + 2 * b, dtype=torch.float32) - b + 0.5  # raster coordinates, margin included
    first = ((t + b - u) / (2 * b)).clamp(0, 1)
    return first, 1 - first


_RAMPS = _ramps()  # made once: every frame of every session blends


def _blend(tiles: list[list[torch.Tensor]]) -> torch.Tensor:
    """The 2 x 2 tiles' pixels (each with ``BLEND`` pixels of margin, ``TileDecoder.decode``)
    as one (3, 128, 128) raster, each tile fading into the next across a band of 2 ``BLEND``
    pixels about their edge. Each tile's decode normalises its features over its own
    surroundings (the decoder's group norms), so two tiles' pixels at a shared edge differ
    even where the codes run on; the fade hides that step. The raster's outer edges lie
    on or outside the view, whose edges show no seam."""
    b, t, ramps = BLEND, TILE_UNITS, _RAMPS
    out = torch.zeros(3, 2 * t + 2 * b, 2 * t + 2 * b)
    for i in (0, 1):
        for j in (0, 1):
            rows, cols = slice(i * t, i * t + t + 2 * b), slice(j * t, j * t + t + 2 * b)
            out[:, rows, cols] += tiles[i][j] * (ramps[i][rows, None] * ramps[j][None, cols])
    return out[:, b : b + 2 * t, b : b + 2 * t]


def _fill_missing(codes: np.ndarray) -> np.ndarray:
    """Codes the canvas lacks (an evicted or never-filled edge) take their nearest held
    neighbour's along rows, then columns; all missing reads as code 0."""
    out = codes.copy()
    for arr in (out, out.T):
        for row in arr:
            held = np.nonzero(row != MISSING)[0]
            if len(held) and len(held) < len(row):
                near = held[np.abs(np.arange(len(row))[:, None] - held[None]).argmin(1)]
                row[:] = row[near]
    out[out == MISSING] = 0
    return out


def _sample(img: torch.Tensor, dy: float, dx: float, h: int, w: int, step: float) -> torch.Tensor:
    """(B, C, H, W) sampled bilinearly on an (h, w) grid whose pixel centres lie at
    ``(dy, dx) + (i + 0.5) * step - 0.5`` in ``img``'s pixel coordinates (edges clamped)."""
    b, _, hh, ww = img.shape
    ys = dy + (torch.arange(h, dtype=torch.float32, device=img.device) + 0.5) * step - 0.5
    xs = dx + (torch.arange(w, dtype=torch.float32, device=img.device) + 0.5) * step - 0.5
    gy = (ys / max(hh - 1, 1)) * 2 - 1
    gx = (xs / max(ww - 1, 1)) * 2 - 1
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")[::-1], -1)[None].expand(b, h, w, 2)
    return F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=True)
