"""Model families by name: ``worldserve serve --model NAME`` gets its runner here.

``default``     the embedded model (model/default/runner.py). ``--weights``: a ``.safetensors`` with its
                ``.json`` beside it; without it, the shipped ``model/default/weights/default``.
``wan-causal``  the Wan2.1 causal family (model/wan/runner.py): Self-Forcing, CausVid, LongLive,
                Rolling Forcing. ``--weights DIR``, all local (nothing is fetched)::

    DIR/transformer/config.json        the transformer's config (Wan's or diffusers' key names,
                                       plus the recipe: chunk, sinks, window, timesteps)
    DIR/transformer/<checkpoint>       model.safetensors (``worldserve convert`` writes it), or
                                       the authors' .pt (``generator_ema`` / ``generator``)
    DIR/vae/                           config.json + diffusion_pytorch_model.safetensors
                                       (diffusers' AutoencoderKLWan), or DIR/Wan2.1_VAE.pth
    DIR/text_encoder/                  config.json + model.safetensors (UMT5 encoder)
    DIR/tokenizer/                     tokenizer_config.json + tokenizer.json or spiece.model

``matrix-game-2`` Matrix-Game 2.0 (model/wan/matrix_game.py): the same backbone steered by keys
                and mouse from an anchor image. ``--weights DIR`` holds ``transformer/`` and the
                VAE as above, ``image_encoder/`` (CLIPVisionModel) instead of the text parts,
                and optionally ``start.png``.

A recipe (model/wan/recipes.py: ``self-forcing``, ``causvid``, ``longlive``, ``rolling-forcing``,
``matrix-game-2-universal`` / ``-gta-drive`` / ``-templerun``) names a published checkpoint with
its authors' inference settings: ``--model wan-causal --recipe longlive``, or ``--model longlive``
alone. With one, ``--weights`` may also be the authors' downloads as they lie (model/wan/layout.py).

``check(name, weights)`` looks at the files before anything heavy loads, so a missing one is an
error at startup that names it; ``load(name, options)`` builds the runner (on the model thread).
This module imports no torch: the server imports it by name, and mypy does not follow it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

DEFAULT = "default"
# One load at a time per process: the libraries build models under a device context (meta
# tensors) that another thread's load can see (in-process test clusters load several workers).
_LOADING = threading.Lock()


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What every family's loader is given (from the server's settings)."""

    weights: Path | None = None  # a file (default) or a directory (wan-causal); None: shipped
    threads: int | None = 1  # torch threads
    dtype: str = "auto"  # float32, bfloat16 or auto (model/dtype.py)
    device: str = "cpu"
    max_sessions: int = 9  # KV cache slots
    cuda_graphs: bool = False
    cpu_trace: bool = True  # on the CPU, chunks as TorchScript traces (model/default/chunk_graph.py)
    canvas: bool = False  # the default model's world canvas (model/default/reference/canvas/ground.py)
    canvas_decode: str = "auto"  # where its tiles decode ahead: auto, between or beside chunks (tile_decode.py)
    canvas_trust: float = 4.0  # on the canvas, the reference_trust (model/default/reference/canvas/ground.py TRUST)
    canvas_sharpen: float = 1.0  # on the canvas, the unsharp mask on its decoded tiles (tile_decode.py SHARPEN)
    canvas_live: bool = False  # on the canvas, the live state of what moves (model/default/reference/live/)
    trace_cache: bool = False  # keep recorded traces between starts (model/default/trace_cache.py)
    trace_cache_dir: Path | None = None  # where; None: $XDG_CACHE_HOME/worldserve/traces
    sizes: tuple[tuple[int, int], ...] | None = None  # (height, width) frame sizes; None: the family's
    recipe: str | None = None  # a published checkpoint's settings (model/wan/recipes.py); None: config.json's
    vae: str = "full"  # the Wan families' decoder: full, tae (TAEHV) or a TAEHV file (model/wan/tae.py)


def _check_default(weights: Path | None, recipe: str | None) -> None:
    if recipe is not None:
        raise ValueError(f"--model default takes no recipe (got {recipe!r}); recipes are the Wan family's")
    if weights is None:
        return
    path = weights if weights.suffix == ".safetensors" else weights.with_suffix(".safetensors")
    for f in (path, path.with_suffix(".json")):
        if not f.is_file():
            raise FileNotFoundError(f"--model default: weights file {f} does not exist")


def _load_default(o: LoadOptions) -> Any:
    from worldserve.model.default.runner import ModelRunner
    from worldserve.model.default.trace_cache import default_dir
    from worldserve.model.default.weights import DEFAULT_WEIGHTS

    cache = (o.trace_cache_dir or default_dir()) if o.trace_cache else None
    return ModelRunner.from_pretrained(
        o.weights or DEFAULT_WEIGHTS, threads=o.threads, max_sessions=o.max_sessions, dtype=o.dtype,
        device=o.device, graphs=o.cuda_graphs and o.device.startswith("cuda"),
        trace=o.cpu_trace and o.device == "cpu", trace_cache=cache, canvas=o.canvas, canvas_decode=o.canvas_decode,
        canvas_trust=o.canvas_trust, canvas_sharpen=o.canvas_sharpen, canvas_live=o.canvas and o.canvas_live,
    )


def _recipe(name: str | None) -> Any:
    from worldserve.model.wan.recipes import get  # torch-free

    return None if name is None else get(name)


def _check_matrix_game(weights: Path | None, recipe: str | None) -> None:
    from worldserve.model.wan.layout import check_image_layout  # torch-free

    if weights is None:
        raise ValueError("--model matrix-game-2 needs --weights DIR (see docs/model-families.md for its layout)")
    check_image_layout(weights, _recipe(recipe))


def _load_matrix_game(o: LoadOptions) -> Any:
    from worldserve.model.wan.matrix_game import MatrixGameRunner

    assert o.weights is not None
    return MatrixGameRunner.from_dir(
        o.weights, threads=o.threads, max_sessions=o.max_sessions, dtype=o.dtype, device=o.device, sizes=o.sizes,
        recipe=_recipe(o.recipe), vae=o.vae,
    )


def _check_wan(weights: Path | None, recipe: str | None) -> None:
    from worldserve.model.wan.layout import check_layout  # torch-free

    if weights is None:
        raise ValueError("--model wan-causal needs --weights DIR (see docs/model-families.md for its layout)")
    check_layout(weights, _recipe(recipe))


def _load_wan(o: LoadOptions) -> Any:
    from worldserve.model.wan.runner import WanRunner

    assert o.weights is not None
    return WanRunner.from_dir(
        o.weights, threads=o.threads, max_sessions=o.max_sessions, dtype=o.dtype, device=o.device, sizes=o.sizes,
        recipe=_recipe(o.recipe), vae=o.vae,
    )


Check = Callable[[Path | None, str | None], None]

# name -> (check the files, build the runner)
MODELS: dict[str, tuple[Check, Callable[[LoadOptions], Any]]] = {
    DEFAULT: (_check_default, _load_default),
    "wan-causal": (_check_wan, _load_wan),
    "matrix-game-2": (_check_matrix_game, _load_matrix_game),
}


def _family(name: str, recipe: str | None) -> tuple[str, str | None]:
    """(family, recipe) of ``--model NAME [--recipe R]``: a recipe's name serves its family."""
    if name in MODELS:
        return name, recipe
    from worldserve.model.wan import recipes

    if name in recipes.names():
        r = recipes.get(name)
        if recipe is not None and recipes.get(recipe) != r:
            raise ValueError(f"--model {name} is a recipe; --recipe {recipe} names another")
        return r.family, r.name
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}; "
                     f"known recipes: {', '.join(recipes.names())}")


def names() -> tuple[str, ...]:
    return tuple(MODELS)


def check(name: str, weights: Path | None, recipe: str | None = None) -> None:
    """Raise (naming the model, file and what was expected) if ``weights`` cannot serve ``name``
    (a family or a recipe) with ``recipe``."""
    family, recipe = _family(name, recipe)
    MODELS[family][0](weights, recipe)


def load(name: str, options: LoadOptions) -> Any:
    """The runner of model ``name`` (a ``session.plan.Runner``), loaded and ready to warm up."""
    family, recipe = _family(name, options.recipe)
    check_fn, load_fn = MODELS[family]
    check_fn(options.weights, recipe)
    with _LOADING:
        return load_fn(replace(options, recipe=recipe))
