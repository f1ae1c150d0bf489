"""Screenshot of the browser client while it streams (docs/browser.png).

    python -m tests.browser.screenshot [--weights PATH] [--out docs/browser.png] [--seconds 60] [--live]

Starts the server on the default weights (or ``--weights``) on its world canvas as served
(``--no-canvas``: without; ``--live``: with the live state of what moves), opens the page in
headless Chromium over WebRTC, steers with W, A, S and D in turn for ``--seconds`` (what a
newcomer does first), and saves a screenshot of the page.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from tests.browser.browser import chromium
from tests.rtc.harness import model_settings, serve_rtc


async def shoot(weights: Path, out: Path, prompt: str, seed: int, bucket: int, seconds: float = 2.1,
                canvas: bool = True, live: bool = False) -> None:
    settings = model_settings(weights, bucket, capacity=2, canvas=canvas, canvas_live=live)
    async with serve_rtc(**settings) as (_, url), chromium(
        viewport={"width": 760, "height": 860}, device_scale_factor=1
    ) as ctx:
        page = await ctx.new_page()
        await page.goto(f"{url}/?prompt={prompt}&seed={seed}&bucket={bucket}")
        await page.wait_for_function("window.worldserve.framesShown > 24", timeout=60000)
        keys = ("w", "d", "w", "a", "w", "s", "d")  # mostly ahead, as a person explores
        for i in range(max(1, round(seconds / 0.7))):
            await page.keyboard.down(keys[i % len(keys)])
            await page.wait_for_timeout(700)
            await page.keyboard.up(keys[i % len(keys)])
        await page.wait_for_function("window.worldserve.latencies.length > 0", timeout=15000)
        await page.wait_for_timeout(800)
        out.parent.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(out))
    print(f"wrote {out}")


def main() -> None:
    from worldserve.model.default.weights import DEFAULT_WEIGHTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--out", type=Path, default=Path("docs/browser.png"))
    ap.add_argument("--prompt", default="a green forest with a village")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=2.1, help="how long to steer before the screenshot")
    ap.add_argument("--no-canvas", action="store_true", help="without the world canvas (--no-canvas)")
    ap.add_argument("--live", action="store_true", help="serve what moves (the server's --canvas-live)")
    args = ap.parse_args()
    asyncio.run(shoot(args.weights, args.out, args.prompt, args.seed, args.bucket, args.seconds, not args.no_canvas,
                      args.live))


if __name__ == "__main__":
    main()
