"""Steer a session with scripted keys and save every frame as a PNG.

    python -m clients.examples.steer --url ws://127.0.0.1:8000/v1/ws --frames 96 --out steer/

The script holds each (keys, mouse) step of ``SCRIPT`` for a number of frames, then the
next; it changes the prompt half way. Frames are named ``frame_<block>_<frame>.png``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from PIL import Image

from worldserve.clients.sdk import WorldClient

# (keys, mouse, frames to hold them)
SCRIPT: list[tuple[tuple[str, ...], tuple[float, float], int]] = [
    (("forward",), (0.0, 0.0), 24),
    (("right",), (0.0, 0.0), 12),
    (("forward", "left"), (0.0, 0.0), 24),
    ((), (0.5, 0.0), 12),
    (("back",), (0.0, 0.0), 24),
]


def steps(total: int) -> list[tuple[tuple[str, ...], tuple[float, float]]]:
    """The script unrolled to one (keys, mouse) per frame, repeated to ``total`` frames."""
    out: list[tuple[tuple[str, ...], tuple[float, float]]] = []
    while len(out) < total:
        for keys, mouse, n in SCRIPT:
            out.extend([(keys, mouse)] * n)
    return out[:total]


async def steer(
    url: str,
    out: Path,
    *,
    frames: int = 96,
    prompt: str = "a green forest",
    second_prompt: str | None = "a snowy forest at night",
    fps: float = 12.0,
    bucket: int = 64,
    api_key: str | None = None,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    plan = steps(frames)
    async with WorldClient(url, api_key=api_key) as client:
        await client.start(prompt, fps=fps, bucket=bucket, codec="jpeg")
        current: tuple[tuple[str, ...], tuple[float, float]] | None = None
        async for ev in client.frames():
            i = len(saved)
            if i >= frames:
                break
            if plan[i] != current:
                current = plan[i]
                await client.action(current[0], current[1])
            if second_prompt and i == frames // 2:
                await client.prompt(second_prompt, wait=False)
            assert ev.image is not None
            path = out / f"frame_{ev.msg.block_idx:05d}_{ev.msg.frame:05d}.png"
            Image.fromarray(ev.image).save(path)
            saved.append(path)
    return saved


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="ws://127.0.0.1:8000/v1/ws")
    ap.add_argument("--out", type=Path, default=Path("steer"))
    ap.add_argument("--frames", type=int, default=96)
    ap.add_argument("--prompt", default="a green forest")
    ap.add_argument("--second-prompt", default="a snowy forest at night")
    ap.add_argument("--fps", type=float, default=12.0)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args(argv)
    saved = asyncio.run(
        steer(args.url, args.out, frames=args.frames, prompt=args.prompt,
              second_prompt=args.second_prompt or None, fps=args.fps, bucket=args.bucket,
              api_key=args.api_key)
    )
    print(f"saved {len(saved)} frames to {args.out}")


if __name__ == "__main__":
    main()
