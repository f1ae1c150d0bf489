"""The adversarial term of training (``training/train.py``, ``--adv-weight``): a patch critic
that tells the renderer's frames from the model's clean-sample guesses.

A few-step clean-sample regressor trained on squared error alone draws what it cannot know
(terrain entering the view) as its average: soft blobs, and late in a long rollout streaks
and mush, since by then every pixel is the model's own. As in adversarial diffusion
distillation, the critic judges the model's x0 guess at every noise level the sampler
visits, so the guess from pure noise learns to be *a* plausible frame rather than the mean
of them, while the frame loss keeps what the context does tell. The critic is fully
convolutional (one logit per ~46-pixel patch, every bucket alike), spectrally normalized,
and conditioned on the frame's scene vector by projection, so a snowy night is judged
against snowy nights. It exists only in training: the exported weights are the model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from worldserve.training.optim_state import load_optimizer_tensors, optimizer_tensors
from worldserve.training.targets import sampled_guesses


class FrameCritic(nn.Module):
    """(M, C, H, W) frames in [-1, 1] and (M, S) scene vectors -> (M, H/8, W/8) logits."""

    def __init__(self, channels: int, scene_dim: int, width: int = 16):
        super().__init__()
        w = (width, 2 * width, 4 * width)
        self.convs = nn.ModuleList([
            spectral_norm(nn.Conv2d(channels, w[0], 4, 2, 1)),
            spectral_norm(nn.Conv2d(w[0], w[1], 4, 2, 1)),
            spectral_norm(nn.Conv2d(w[1], w[2], 4, 2, 1)),
            spectral_norm(nn.Conv2d(w[2], w[2], 3, 1, 1)),
        ])
        self.out = spectral_norm(nn.Conv2d(w[2], 1, 1))
        self.scene = spectral_norm(nn.Linear(scene_dim, w[2], bias=False))

    def forward(self, frames: torch.Tensor, scene: torch.Tensor) -> torch.Tensor:
        h = frames
        for conv in self.convs:
            h = F.leaky_relu(conv(h), 0.2)
        proj = (h * self.scene(scene)[:, :, None, None]).sum(1)  # projection: the scene's say
        return self.out(h)[:, 0] + proj


class Adversary:
    """The critic, its optimizer, and the two hinge losses of one training step.

    ``generator_loss`` is the model's term (added to its loss before its backward);
    ``critic_step`` then trains the critic on the same step's frames, real against the
    detached guesses. ``frames`` caps how many frames of a batch either sees (a random
    subset), which bounds the critic's cost."""

    def __init__(self, channels: int, scene_dim: int, lr: float = 2e-4, frames: int = 48,
                 width: int = 16, device: torch.device | str = "cpu"):
        self.critic = FrameCritic(channels, scene_dim, width).to(device)
        self.opt = torch.optim.Adam(self.critic.parameters(), lr=lr, betas=(0.0, 0.99))
        self.frames = frames
        self._pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def generator_loss(self, pred: torch.Tensor, real: torch.Tensor, scene: torch.Tensor,
                       g: torch.Generator, reach: torch.Tensor | None = None) -> torch.Tensor:
        """pred, real (B, N, C, H, W); scene (B, N, S). The model's hinge term, -critic(pred);
        keeps the same frames (detached) for ``critic_step``. ``reach`` (B, N, 1, H, W) in
        [0, 1]: where the term may move the guess (the critic still sees all of it); the
        model's training passes where its anchor shows nothing, so that what it carries is
        left to the frame loss and only what it makes up is charged for looking made up."""
        fake, real, idx = sampled_guesses(pred, real, g, self.frames, reach)
        scene = scene.flatten(0, 1)[idx]
        self._pending = (fake.detach(), real, scene.detach())
        self.critic.requires_grad_(False)  # the model's backward leaves the critic alone
        try:
            return -self.critic(fake, scene).mean()
        finally:
            self.critic.requires_grad_(True)

    def critic_step(self) -> dict[str, torch.Tensor]:
        """One update of the critic on the frames of the last ``generator_loss``."""
        if self._pending is None:
            raise RuntimeError("critic_step needs a generator_loss first")
        fake, real, scene = self._pending
        self._pending = None
        d_real = self.critic(real, scene)
        d_fake = self.critic(fake, scene)
        loss = F.relu(1 - d_real).mean() + F.relu(1 + d_fake).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return {"critic": loss.detach(), "critic_gap": (d_real.mean() - d_fake.mean()).detach()}

    def state(self) -> dict[str, torch.Tensor]:
        """Critic weights and optimizer moments, flat, for the checkpoint."""
        out = {f"critic.{k}": v for k, v in self.critic.state_dict().items()}
        out.update(optimizer_tensors(self.opt, self.critic, "copt."))
        return out

    def load(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Restore from a checkpoint's tensors; False (the critic starts fresh) when it holds none."""
        crit = {k[len("critic."):]: v for k, v in tensors.items() if k.startswith("critic.")}
        if not crit:
            return False
        self.critic.load_state_dict(crit)
        load_optimizer_tensors(self.opt, self.critic, tensors, "copt.")
        return True
