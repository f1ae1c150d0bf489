"""Files written whole: a temporary file beside the final one, then renamed over it.

A reader (a resume, a server loading an export) sees the old file or the new one, never half
of one, even when the writer is killed mid-way or the disk fills.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, whole."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
