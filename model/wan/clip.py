"""The CLIP image tokens Matrix-Game 2.0's cross-attention reads: CLIP ViT-H/14 through
``transformers``' ``CLIPVisionModel``, as Wan's image-to-video models use it.

Wan's CLIP (``encode_video`` of the authors' wrapper) resizes the whole frame to the model's
224 x 224 (bicubic, no crop), normalises with CLIP's mean and std, and returns the tokens
after the penultimate transformer layer: 257 tokens (the class token and 16 x 16 patches) of
width 1280. In transformers' terms that is ``hidden_states[-2]``; the same weights ship as the
``image_encoder`` folder of Wan-AI/Wan2.1-I2V-14B-480P-Diffusers. The model is built from local
files only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ImageEncoder:
    """One CLIPVisionModel; ``encode(frame)`` -> (1, N, width) tokens of a uint8 frame."""

    def __init__(self, model) -> None:
        self.model = model.eval().requires_grad_(False)
        self.size: int = int(model.config.image_size)
        self.dim: int = int(model.config.hidden_size)

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
             ) -> ImageEncoder:
        from transformers import CLIPVisionModel

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"CLIP image encoder {path} has no config.json")
        model = CLIPVisionModel.from_pretrained(path, local_files_only=True, dtype=dtype)
        return cls(model.to(device))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def encode(self, frame: np.ndarray) -> torch.Tensor:
        """frame (H, W, 3) uint8 -> tokens (1, N, dim) float32 on the model's device."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"CLIP takes a (H, W, 3) uint8 frame, got {frame.dtype} {frame.shape}")
        x = torch.from_numpy(np.ascontiguousarray(frame)).to(self.device).permute(2, 0, 1)[None].float() / 255.0
        x = F.interpolate(x, size=(self.size, self.size), mode="bicubic", align_corners=False)
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        x = ((x - mean) / std).to(next(self.model.parameters()).dtype)
        out = self.model(pixel_values=x, output_hidden_states=True)
        return out.hidden_states[-2].float()  # (1, N, dim): after the penultimate layer
