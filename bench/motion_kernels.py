"""How sharp the model's motion kernels are: the mass its warp puts on the commanded shift.

    python -m bench.motion_kernels [--weights PATH] [--frames 6]

The head predicts each frame as the previous frame moved by per-token kernels (``shift_warp``)
plus a residual. A kernel that spreads its weight over neighbouring offsets blurs the frame a
little every step, and the blur adds up over a rollout. For a few held actions on a held-out
world, after ``--frames`` frames of that action, this prints the x and y kernels of the final
denoising step, averaged over tokens, and their weight on the offset the renderer's camera
actually moves by (whole pixels at these speeds).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import worldserve.model.default.net.dit as dit
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.session.plan import ACTION_DIM, KEYS, Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.training.train import HELD_OUT_SEEDS
from worldserve.world import World, expected_shift, sample_scene

ACTIONS = {  # name -> {action index: value}
    "idle": {},
    "forward": {KEYS.index("forward"): 1.0},
    "right": {KEYS.index("right"): 1.0},
    "forward+right": {KEYS.index("forward"): 1.0, KEYS.index("right"): 1.0},
    "mouse x 0.5": {len(KEYS): 0.5},
    "mouse y -1": {len(KEYS) + 1: -1.0},
}


def kernels_after(runner: ModelRunner, world: World, action: np.ndarray, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean (ky, kx) over tokens at the last denoising step of the ``frames``-th chunk."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = dit.shift_warp

    def spy(prev, ky, kx, radius, p):  # type: ignore[no-untyped-def]
        seen.append((ky.mean(dim=(0, 1, 2)), kx.mean(dim=(0, 1, 2))))
        return real(prev, ky, kx, radius, p)

    runner.execute(StepPlan(new_sessions=[SessionSpec("k", 64, seed=0, scene=world.scene.to_prompt(),
                                                      observation=world.render(64))]))
    dit.shift_warp = spy
    try:
        for c in range(frames):
            seen.clear()
            out = runner.execute(StepPlan(batches=[Batch(64, runner.max_steps, [ChunkWork("k", c, action[None])])]))
            if out.errors:
                raise RuntimeError(out.errors)
    finally:
        dit.shift_warp = real
        runner.execute(StepPlan(freed=["k"]))
    ky, kx = seen[-1]
    return ky.float().numpy(), kx.float().numpy()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    runner = ModelRunner.from_pretrained(args.weights, max_sessions=2)
    rng = np.random.default_rng(5)
    radius = runner.cfg.radius(64)
    print(f"{'action':<14} {'shift dy,dx':>11} {'mass y':>7} {'mass x':>7}  "
          f"mean x kernel over offsets -{radius}..{radius}")
    masses = []
    for name, entries in ACTIONS.items():
        action = np.zeros(ACTION_DIM, np.float32)
        for i, v in entries.items():
            action[i] = v
        world = World(HELD_OUT_SEEDS[500], sample_scene(rng), (64,))
        world.reset(world.random_position(rng))
        ky, kx = kernels_after(runner, world, action, args.frames)
        dy, dx = expected_shift(action, 64)
        # out(y, x) = sum_i k[i] prev(y + i - r, x + ...): a scene moving by d pixels needs offset -d
        my, mx = float(ky[radius - round(dy)]), float(kx[radius - round(dx)])
        masses += [my, mx]
        kernel = np.array2string(kx, precision=3, suppress_small=True)
        print(f"{name:<14} {f'{dy:+.0f},{dx:+.0f}':>11} {my:>7.3f} {mx:>7.3f}  {kernel}")
    print(f"motion_kernels mean_mass={np.mean(masses):.3f} min_mass={np.min(masses):.3f}")


if __name__ == "__main__":
    main()
