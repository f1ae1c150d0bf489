"""The house's layering, read from every module's imports (docs/architecture.md), and its module
budget.

Every package of the ``worldserve`` namespace has a rule: the modules it must not name. An
import is read in every form it takes: ``import x``, ``from x import y``, relative imports
(``from .foo import y``, ``from .. import y``), and a string literal naming a module of the house
(``importlib.import_module("worldserve.bench.drill")``, ``python -m worldserve.cli`` on a
command line): naming a module to load it later is depending on it. A logger's name
(``logging.getLogger("worldserve.cli")``) names no module.

The budget: a module holds one idea and reads in one sitting, so no Python module of the house
(its packages and tests/) and no script of the web client is over ``MAX_LINES`` lines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NS = "worldserve"
MAX_LINES = 600

# The packages of the namespace, each a folder at the top of the repository. The server is two
# layers: its core (server/ without server/cluster/) and the cluster wing on top of it.
PACKAGES = (
    "protocol", "session", "world", "model", "training", "server", "clients", "bench", "cli",
)
CLUSTER = "server.cluster"


@dataclass(frozen=True)
class Rule:
    forbidden: tuple[str, ...]  # module prefixes: "worldserve.server", "torch"
    allowed: tuple[str, ...] = ()  # exceptions under a forbidden prefix, in any form
    by_name: tuple[str, ...] = ()  # exceptions under a forbidden prefix, as a literal only


def _house(*packages: str) -> tuple[str, ...]:
    return tuple(f"{NS}.{p}" for p in packages)


RULES: dict[str, Rule] = {
    # The wire format: nothing of the house.
    "protocol": Rule(forbidden=(NS,), allowed=_house("protocol")),
    # The logical state: plain Python and numpy, no transport, no model.
    "session": Rule(
        forbidden=("torch", "aiohttp",
                   *_house("server", "model", "clients", "training", "bench", "world", "cli")),
    ),
    # The procedural world: numpy only.
    "world": Rule(
        forbidden=("torch",
                   *_house("session", "server", "model", "clients", "training", "bench", "cli")),
    ),
    # The physical state. Of the world it reads the scene vocabulary and a session's start frame
    # (world.start, whose functions the world package re-exports); serving never draws the
    # world's moving things (world.actors, world.atmosphere, world.sprites, world.render).
    "model": Rule(
        forbidden=_house("server", "clients", "training", "bench", "cli", "world"),
        allowed=_house("world.scene", "world.start"),
    ),
    "training": Rule(forbidden=_house("server", "cli")),
    # The core loads a model family through the registry, by name, so serving imports no torch.
    "server": Rule(
        forbidden=("torch", *_house("server.cluster", "model", "world", "training", "bench",
                                    "clients", "cli")),
        by_name=_house("model.registry"),
    ),
    # The cluster wing stands on the core; nothing of the model or the tools.
    CLUSTER: Rule(
        forbidden=("torch", *_house("model", "world", "training", "bench", "clients", "cli")),
    ),
    # The client speaks the protocol only; it may launch a local server through the front door.
    "clients": Rule(
        forbidden=("torch",
                   *_house("session", "server", "model", "training", "bench", "world", "cli")),
        by_name=_house("cli"),
    ),
    "bench": Rule(forbidden=_house("cli")),
    # The command-line front door: the only package that may name every other.
    "cli": Rule(forbidden=()),
}


# ------------------------------------------------------------------------- reading imports


@dataclass(frozen=True)
class Import:
    name: str  # absolute: "worldserve.server.cli", "torch.nn"
    line: int
    form: str  # "import", "from", "relative" or "literal"


_LITERAL = re.compile(rf"{NS}(\.[A-Za-z_]\w*)+")


def module_name(path: Path, root: Path = ROOT) -> str:
    """``server/cluster/agent.py`` -> ``worldserve.server.cluster.agent``; a package is named
    by its folder."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NS, *parts])


def _source(module: str, root: Path) -> Path | None:
    """The file of a module of the house, if there is one."""
    base = root.joinpath(*module.split(".")[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@cache
def _reexports(package: str, root: Path) -> dict[str, str]:
    """What a package's ``__init__`` re-exports from its own modules: name -> module."""
    init = _source(package, root)
    if init is None or init.name != "__init__.py":
        return {}
    out: dict[str, str] = {}
    for node in ast.parse(init.read_text(), str(init)).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 1:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{package}.{node.module}"
    return out


def _resolve(base: str, name: str, root: Path) -> str:
    """The module ``from base import name`` depends on: the submodule ``name``, the module a
    package re-exports ``name`` from, or ``base`` itself."""
    if name == "*" or not (base == NS or base.startswith(f"{NS}.")):
        return base
    if _source(f"{base}.{name}", root) is not None:
        return f"{base}.{name}"
    return _reexports(base, root).get(name, base)


def _relative(module: str, is_package: bool, level: int, rest: str | None) -> str:
    package = module.split(".") if is_package else module.split(".")[:-1]
    parts = package[: len(package) - (level - 1)]
    return ".".join(parts + ([rest] if rest else []))


def _called(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def imports(path: Path, root: Path = ROOT) -> Iterator[Import]:
    """Every module of the house or beyond that ``path`` names, with where and how."""
    module = module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    logger_names: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) == "getLogger":
            logger_names.update(id(a) for a in node.args)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, "import")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base, form = _relative(module, is_package, node.level, node.module), "relative"
            else:
                base, form = node.module or "", "from"
            for alias in node.names:
                yield Import(_resolve(base, alias.name, root), node.lineno, form)
        elif isinstance(node, ast.Call) and _called(node) == "import_module" and node.args:
            arg = node.args[0]  # import_module(".name", package=__package__)
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("."):
                rest = str(arg.value).lstrip(".")
                name = _relative(module, is_package, len(str(arg.value)) - len(rest), rest or None)
                yield Import(name, node.lineno, "literal")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in logger_names and _LITERAL.fullmatch(node.value)):
            yield Import(node.value, node.lineno, "literal")


# ------------------------------------------------------------------------- the rules


def layer_of(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).parts
    return CLUSTER if parts[:2] == ("server", "cluster") else parts[0]


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


def violations(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: module (form)`` for each import that breaks its layer's rule."""
    rule = RULES[layer_of(path, root)]
    rel = path.relative_to(root)
    found = [
        f"{rel}:{imp.line}: {imp.name} ({imp.form})"
        for imp in imports(path, root)
        if _under(imp.name, rule.forbidden)
        and not _under(imp.name, rule.allowed)
        and not (imp.form == "literal" and _under(imp.name, rule.by_name))
    ]
    # by line; the module of ``from m import a, b`` once
    return sorted(dict.fromkeys(found), key=lambda v: int(v.split(":")[1]))


def modules(layer: str, root: Path = ROOT) -> list[Path]:
    top = root.joinpath(*layer.split("."))
    return sorted(p for p in top.rglob("*.py") if layer_of(p, root) == layer)


@pytest.mark.parametrize("layer", sorted(RULES))
def test_a_package_names_only_what_its_layer_allows(layer: str) -> None:
    if not (ROOT / layer.split(".")[0]).is_dir():
        pytest.skip(f"{layer}/ is not there yet")
    assert [v for p in modules(layer) for v in violations(p)] == []


def test_every_package_of_the_namespace_has_a_rule() -> None:
    setup = (ROOT / "pyproject.toml").read_text()
    declared = set(re.findall(rf'"{NS}\.(\w+)" = "\w+"', setup))  # [tool.setuptools.package-dir]
    assert declared <= set(PACKAGES) and set(PACKAGES) <= set(RULES)
    assert CLUSTER in RULES


# ------------------------------------------------------------------------- each rule can fail

# For each rule, a module of its layer and a package the rule forbids it.
BREAKS: dict[str, tuple[str, str]] = {
    "protocol": ("protocol/codec.py", "session"),
    "session": ("session/store.py", "server"),
    "world": ("world/render.py", "model"),
    "model": ("model/default/runner.py", "training"),
    "training": ("training/train.py", "server"),
    "server": ("server/rtc/offer.py", CLUSTER),
    CLUSTER: ("server/cluster/agent.py", "bench"),
    "clients": ("clients/sdk.py", "model"),
    "bench": ("bench/drill.py", "cli"),
}


def _forms(where: str, package: str) -> list[str]:
    """One import of a module of ``package`` from the module at ``where``, in each form."""
    folder = ROOT.joinpath(*package.split("."))
    mods = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")) or ["main"]
    target = f"{NS}.{package}.{mods[0]}"
    here = module_name(ROOT / where).split(".")[:-1]  # the planted module's package
    there = target.split(".")
    common = next(i for i, (a, b) in enumerate(zip([*here, ""], there, strict=False)) if a != b)
    dots = "." * (len(here) - common + 1)
    return [
        f"import {target}",
        f"from {'.'.join(there[:-1])} import {there[-1]}",
        f"from {dots}{'.'.join(there[common:-1])} import {there[-1]}",
        f"importlib.import_module({target!r})",
    ]


def test_every_rule_has_a_planted_break() -> None:
    assert set(BREAKS) == {layer for layer, rule in RULES.items() if rule.forbidden}


# Each rule broken in each form an import takes, and the forms a rule names in particular.
PLANTED: list[tuple[str, str]] = [
    *((where, line) for where, package in BREAKS.values() for line in _forms(where, package)),
    ("protocol/codec.py", "import worldserve.session.store"),
    ("protocol/codec.py", "from ..session import store"),
    ("session/store.py", "import torch"),
    ("session/store.py", "from aiohttp import web"),
    ("session/store.py", "from ..server import app"),
    ("session/store.py", "importlib.import_module('worldserve.model.registry')"),
    ("world/render.py", "from ..model import registry"),
    ("model/registry.py", "from worldserve.server import app"),
    ("model/registry.py", "from ..training import train"),
    ("model/default/runner.py", "from ...clients import sdk"),
    ("model/default/runner.py", "from ...world import render"),
    ("model/default/runner.py", "from worldserve.world.actors import Actors"),
    ("model/wan/runner.py", "importlib.import_module('worldserve.bench.drill')"),
    ("training/train.py", "from ..server.settings import Settings"),
    ("training/train.py", "importlib.import_module('worldserve.server.app')"),
    ("server/app.py", "from .cluster import agent"),
    ("server/app.py", "from . import cluster"),
    ("server/app.py", "from worldserve.server.cluster.agent import Agent"),
    ("server/app.py", "from ..model import registry"),
    ("server/app.py", "importlib.import_module('worldserve.training.train')"),
    ("server/app.py", "importlib.import_module('.cluster.agent', package=__package__)"),
    ("server/app.py", "subprocess.run([sys.executable, '-m', 'worldserve.bench.drill'])"),
    ("server/app.py", "from worldserve.clients.sdk import Client"),
    ("server/rtc/offer.py", "from ...cli import main"),
    ("server/cluster/agent.py", "from ...training import train"),
    ("server/cluster/agent.py", "import torch"),
    ("clients/sdk.py", "from ..server import app"),
    ("clients/sdk.py", "importlib.import_module('worldserve.model.replay')"),
    ("clients/sdk.py", "from worldserve.cli import main"),
    ("bench/drill.py", "from ..cli import main"),
]


def _plant(tmp_path: Path, where: str, line: str) -> Path:
    """A module at ``where`` in a copy of the house (the other folders linked, so that relative
    imports resolve as they would), its fifth line ``line``."""
    src, path = ROOT, tmp_path
    for part in Path(where).parts:
        path.mkdir(exist_ok=True)
        for entry in src.iterdir() if src.is_dir() else ():
            if entry.name != part and not (path / entry.name).exists():
                (path / entry.name).symlink_to(entry)
        src, path = src / part, path / part
    # never through a link into the house itself: the planted module is written in the copy only
    assert path.parent.resolve().is_relative_to(tmp_path.resolve()), path
    path.write_text(f'"""A planted module."""\n\nimport importlib\n\n{line}\n')
    return path


@pytest.mark.parametrize(("where", "line"), PLANTED)
def test_a_planted_import_that_breaks_a_rule_is_reported(
    tmp_path: Path, where: str, line: str
) -> None:
    found = violations(_plant(tmp_path, where, line), tmp_path)
    assert len(found) == 1 and found[0].startswith(f"{where}:5: "), found


@pytest.mark.parametrize(("where", "line"), [
    ("model/default/runner.py", "from worldserve.world import start_frame"),  # world.start's
    ("model/default/runner.py", "from ...world.scene import parse_prompt"),
    ("server/app.py", "importlib.import_module('worldserve.model.registry')"),
    ("server/cluster/agent.py", "from ..service import Service"),
    ("clients/local.py", "subprocess.run([sys.executable, '-m', 'worldserve.cli', 'serve'])"),
    ("server/app.py", "log = logging.getLogger('worldserve.cli')"),
    ("cli/main.py", "importlib.import_module('worldserve.training.train')"),
])
def test_what_a_layer_may_name_is_not_reported(tmp_path: Path, where: str, line: str) -> None:
    path = _plant(tmp_path, where, line)
    assert violations(path, tmp_path) == []


def test_relative_imports_resolve_against_the_module_s_package() -> None:
    assert _relative("worldserve.server.app", False, 1, "cluster") == "worldserve.server.cluster"
    cluster = "worldserve.server.cluster"
    assert _relative(cluster, True, 1, "agent") == f"{cluster}.agent"
    assert _relative("worldserve.server.cluster.agent", False, 2, None) == "worldserve.server"
    assert _relative("worldserve.model.default.runner", False, 3, "world") == "worldserve.world"


# ------------------------------------------------------------------------- the module budget


def _budgeted() -> list[Path]:
    python = [p for package in ("tests", *PACKAGES) for p in sorted((ROOT / package).rglob("*.py"))]
    return python + sorted((ROOT / "clients" / "web").glob("*.js"))


def over_budget(paths: list[Path], root: Path = ROOT) -> dict[str, int]:
    """The files over ``MAX_LINES`` lines, with their length."""
    lengths = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in paths}
    return {name: n for name, n in lengths.items() if n > MAX_LINES}


def test_no_module_is_over_the_line_budget() -> None:
    assert over_budget(_budgeted()) == {}


def test_a_module_over_the_budget_is_reported(tmp_path: Path) -> None:
    short, long = tmp_path / "short.py", tmp_path / "long.js"
    short.write_text("x = 1\n" * MAX_LINES)
    long.write_text("x;\n" * (MAX_LINES + 1))
    assert over_budget([short, long], tmp_path) == {"long.js": MAX_LINES + 1}
