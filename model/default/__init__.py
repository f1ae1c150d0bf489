"""The embedded default model: its network (``net/``), the references it reads beside its cache
(``reference/``: the anchor and the world canvas) and the runner that serves it."""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"  # the committed weights of every part
