"""The Wan causal family's networks from a checked ``--weights`` directory: the transformer (the
recipe's state dict of the checkpoint, its LoRA merged) and the streaming decoder, the full
Wan2.1 VAE or TAEHV (``--vae tae``), both behind one decoding interface (``Decoder``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch

from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.layout import WanFiles
from worldserve.model.wan.recipes import Served
from worldserve.model.wan.vae_stream import StreamingDecoder

if TYPE_CHECKING:
    from worldserve.model.wan.tae import TaeDecoder

Decoder = Union[StreamingDecoder, "TaeDecoder"]  # the full VAE or TAEHV (--vae tae): one decoding interface

log = logging.getLogger(__name__)


def load_backbone(
    files: WanFiles, cfg: WanConfig, served: Served, *, threads: int | None, dtype: str | torch.dtype, device: str,
    vae: str = "full", root: str | Path | None = None, encode: bool = False,
) -> tuple[CausalWanModel, Decoder, torch.dtype]:
    """The transformer (the recipe's state dict of the checkpoint, its LoRA merged) and the
    streaming decoder of a checked ``--weights`` directory ``root``, in the float type ``dtype``
    names (``auto``: the device's pick), and that type. Logs the recipe served.

    ``vae``: ``full`` decodes with the Wan2.1 VAE; ``tae`` with TAEHV (model/wan/tae.py), its
    ``taew2_1.pth`` found in ``root`` (``find_tae``) before anything loads, or a path to that
    file. ``encode``: the runner also encodes frames, so with TAEHV the full VAE is loaded too."""
    from worldserve.model.dtype import pick_dtype
    from worldserve.model.wan.weights import load_model

    tae = None
    if vae != "full":
        from worldserve.model.wan.tae import find_tae

        tae = find_tae(root if root is not None else files.vae.parent, files.vae) if vae == "tae" else Path(vae)
        if not tae.is_file():
            raise FileNotFoundError(f"--vae {vae}: {tae} does not exist (--vae takes full, tae or a TAEHV .pth)")
    if threads is not None:
        torch.set_num_threads(threads)
    dt = pick_dtype(dtype, device=device) if isinstance(dtype, str) else dtype
    r = served.recipe
    model = load_model(files.checkpoint, cfg, dtype=dt, device=device, key=r.checkpoint_key if r else None,
                       lora=files.lora, lora_alpha=r.lora_alpha if r and r.lora else None)
    log.info("serving recipe %s", json.dumps(served.describe(cfg)))
    if tae is None:
        return model, StreamingDecoder.load(files.vae, device=device, dtype=dt), dt
    from worldserve.model.wan.tae import TaeDecoder

    full = StreamingDecoder.load(files.vae, device=device, dtype=dt) if encode else None
    log.info("decoding with TAEHV (%s)%s", tae, "; the Wan2.1 VAE encodes" if encode else "")
    return model, TaeDecoder.load(tae, device=device, dtype=dt, encoder=full), dt
