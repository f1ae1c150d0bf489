"""``worldserve convert``: an authors' Wan file -> what the server loads (model/wan/convert.py)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path


def convert_parser(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("src", type=Path, help="a distilled transformer .pt / .safetensors, or the "
                                           "UMT5 models_t5_umt5-xxl-enc-bf16.pth")
    ap.add_argument("dst", type=Path, help="the .safetensors (a transformer) or folder (UMT5)")
    ap.add_argument("--recipe", help="the checkpoint's recipe: its state dict (EMA or not)")
    ap.add_argument("--lora", type=Path, help="a LoRA to merge in (LongLive's lora.pt)")


def convert(args: argparse.Namespace) -> None:
    try:  # by name: mypy checks the command line, not model/
        importlib.import_module("worldserve.model.wan.convert").run(
            args.src, args.dst, recipe=args.recipe, lora=args.lora)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"worldserve convert: {exc}") from None
    print(f"wrote {args.dst}")
