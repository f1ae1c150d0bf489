"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright, with the flags
DESIGN.md §9 found to work here. Never downloads a browser."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")

ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    # Host candidates as IPs, not mDNS names (aioice spends ~1 s failing on those).
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    # On a loopback-only box Chromium leaves 127.0.0.1 out of its candidates too.
    "--allow-loopback-in-peer-connection",
]


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists() and shutil.which("chromium") is None:
        return "chromium is not installed (scripts/system-deps.sh installs it)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


@asynccontextmanager
async def chromium(**context: Any) -> AsyncIterator[Any]:
    """A fresh browser context (Playwright ``BrowserContext``)."""
    from playwright.async_api import async_playwright

    exe = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        try:
            ctx = await browser.new_context(**context)
            try:
                yield ctx
            finally:
                await ctx.close()
        finally:
            await browser.close()
