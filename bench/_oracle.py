"""The oracle reference: the served model with its anchor reference taken from the renderer
(``bench.quality --oracle``), the ceiling of a model that composes on a perfect world canvas.

A canvas of the place (issue 38: ground codes in world coordinates) would hand the causal model the true
ground of what it shows instead of its own earlier frames. ``OracleRunner`` measures how far
that takes a set of weights before anything is trained for it: every ``every`` frames the
bench gives each session a view of the renderer as its anchor (``refresh``), and the
reference is that view moved by the camera shift summed since. The sum is exact: the served
runner sums the model's shift head, which export solves in closed form for the commanded
shift (``training.targets.fit_shift_head``; ``test_the_shift_head_sums_the_commanded_shift``
holds it to that). The session never re-anchors on its own frames. Three views:

- ``frame``: what the renderer shows at that moment, actors and weather included (the weights
  were trained on such anchors: the sequence's first frame);
- ``ground``: the ground alone (``World.render_ground``: the map and the rain or snow lying on
  it; no actors, water glints, cloud shadows or fog), what a canvas of ground codes would
  hold; the weights never saw such a reference. ``ground:1`` hands it over every frame, as a
  canvas would;
- ``tokens``: the ground view through the committed ground tokenizer (encoded and decoded
  under the world's scene), what a canvas of ground codes decodes to with that tokenizer:
  ``tokens:1`` is the ceiling of the canvas with today's tokenizer and compositor.

Bench-only: serving never builds one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from worldserve.model.default.reference.anchor import AnchorReference, AnchorState
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS as TOKENIZER_WEIGHTS
from worldserve.model.default.reference.canvas.tokenizer import GroundTokenizer, load_tokenizer
from worldserve.model.default.runner import ModelRunner
from worldserve.world import World

VIEWS = ("frame", "ground", "tokens")


@dataclass(frozen=True)
class Oracle:
    """How an oracle session's reference is made: which view of the renderer, how often."""

    view: str  # one of VIEWS
    every: int  # frames between refreshes (the weights saw anchors up to 15 frames old)

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ValueError(f"oracle view {self.view!r} is not one of {VIEWS}")
        if not 1 <= self.every <= 16:
            raise ValueError(f"oracle refresh every {self.every} frames: must be 1 to 16")

    @classmethod
    def parse(cls, text: str, every: int) -> Oracle:
        """``VIEW`` or ``VIEW:EVERY`` (``--oracle``); ``every`` where the text gives no period."""
        view, _, period = text.partition(":")
        try:
            return cls(view, int(period) if period else every)
        except ValueError as exc:
            raise ValueError(f"--oracle {text!r}: {exc}") from exc

    @property
    def label(self) -> str:
        return f"oracle-{self.view}-{self.every}"

    def due(self, t: int) -> bool:
        """Whether the reference is refreshed after frame ``t`` (frame 0, the observation,
        anchors every session already)."""
        return t > 0 and t % self.every == 0

    def view_of(self, world: World, bucket: int) -> np.ndarray:
        if self.view == "frame":
            return world.render(bucket)
        if self.view == "ground":
            return world.render_ground(bucket)
        return _round_trip(world.render_ground(bucket), world.scene.to_vector())


@functools.cache
def _tokenizer() -> GroundTokenizer:
    return load_tokenizer(TOKENIZER_WEIGHTS)


@torch.inference_mode()
def _round_trip(view: np.ndarray, scene: np.ndarray) -> np.ndarray:
    """``view`` (H, W, 3) uint8 encoded to ground codes and decoded under ``scene``."""
    x = torch.from_numpy(view).permute(2, 0, 1)[None].float() / 127.5 - 1
    tok = _tokenizer()
    out = tok.decode(tok.encode(x), torch.from_numpy(np.asarray(scene, np.float32))[None])
    return ((out[0].clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()


class OracleAnchors(AnchorReference):
    """Anchors that keep their summed shift and never re-anchor on the model's own frame."""

    def advance(self, states: list[AnchorState], newest: torch.Tensor, moved: torch.Tensor) -> None:
        for i, st in enumerate(states):
            st.offset = moved[i, -1]
            st.age += self.cfg.frames_per_chunk


class OracleRunner(ModelRunner):
    """A ``ModelRunner`` whose anchors come from ``refresh`` alone."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.ref = OracleAnchors(self.cfg, self.model.camera_shift, self.device, self.dtype)

    def refresh(self, session_id: str, view: np.ndarray) -> None:
        """Anchor the session on ``view`` ((H, W, 3) uint8, the renderer's at the session's
        newest frame), nothing moved yet."""
        self._get(session_id).ref.on(self._encode(view[None])[0])
