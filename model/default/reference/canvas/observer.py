"""The observation encoder: the ground codes under a frame as it is seen (issue 38, item 3's
second encoder).

A client's ``observation`` shows the world with what moves and what the air does on top of the
ground: animals, boats, cloud shadows, fog, falling rain or snow, glints on water. The ground
tokenizer's encoder learnt on the ground alone, so it writes all of that into the canvas as
ground, for good (a boat stays behind as a dark patch of water). The observation encoder has
the tokenizer encoder's shape and is trained (``training/observer.py``) to give, from the seen
frame, the codes the ground tokenizer gives the ground alone under it; the codebook is the
tokenizer's, so its codes are the canvas's and the bank's.

Weights: ``model/default/weights/observer.safetensors`` (half precision) beside a JSON of the
tokenizer config it belongs to and its report. Where they are missing, observations are encoded
by the ground tokenizer's own encoder.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from worldserve.model.default import WEIGHTS_DIR
from worldserve.model.default.reference.canvas.tokenizer import Encoder, GroundTokenizer

log = logging.getLogger(__name__)
OBSERVER = WEIGHTS_DIR / "observer"  # the committed export (no suffix)


def observer_from(tokenizer: GroundTokenizer) -> Encoder:
    """A fresh observation encoder: a copy of ``tokenizer``'s encoder (today's behaviour)."""
    enc = Encoder(tokenizer.cfg)
    enc.load_state_dict(tokenizer.encoder.state_dict())
    return enc


def codebook_id(tokenizer: GroundTokenizer) -> str:
    """A fingerprint of ``tokenizer``'s codebook: an observer serves only the codes it learnt."""
    table = tokenizer.quantizer.codebook.detach().to(torch.float16).contiguous().numpy()
    return hashlib.sha256(table.tobytes()).hexdigest()[:16]


def save_observer(encoder: Encoder, tokenizer: GroundTokenizer, dest: Path, report: dict | None = None) -> Path:
    """``dest``.safetensors (half precision) and ``dest``.json (the tokenizer's config and
    codebook fingerprint, ``report``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    path = dest.with_suffix(".safetensors")
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in encoder.state_dict().items()}, str(path))
    meta = {"config": asdict(tokenizer.cfg), "codebook": codebook_id(tokenizer)}
    meta |= {"report": report} if report else {}
    dest.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    return path


def load_observer(dest: Path, tokenizer: GroundTokenizer) -> Encoder | None:
    """The observation encoder at ``dest`` (no suffix) in float32; None where there is none, or
    where it learnt another codebook than ``tokenizer``'s (logged)."""
    if not dest.with_suffix(".safetensors").exists():
        return None
    meta = json.loads(dest.with_suffix(".json").read_text())
    if meta.get("codebook") != codebook_id(tokenizer):
        log.warning("observation encoder %s learnt another tokenizer's codes: observations use the tokenizer's", dest)
        return None
    enc = Encoder(tokenizer.cfg)
    enc.load_state_dict({k: v.float() for k, v in load_file(str(dest.with_suffix(".safetensors"))).items()})
    return enc.eval()


def observed_codes(tokenizer: GroundTokenizer, observer: Encoder | None, frames: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) seen frames in [-1, 1] -> (B, H/4, W/4) ground code ids: by the observation
    encoder where there is one, else by the tokenizer's."""
    if observer is None:
        return tokenizer.encode(frames)
    return tokenizer.quantizer.ids(observer(frames))
