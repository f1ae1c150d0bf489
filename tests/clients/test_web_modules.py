"""The browser client's ES modules (clients/web/): the page loads app.js as a module, every
import names a file beside it (server/web.py serves plain files of that folder only), each
module is reached from app.js, and no two modules import each other, however indirectly."""

from __future__ import annotations

import re
from pathlib import Path

WEB = Path(__file__).resolve().parents[2] / "clients" / "web"
_IMPORT = re.compile(r'^import\s[^;]*?from\s+"\./([^"]+)";', re.MULTILINE | re.DOTALL)


def graph() -> dict[str, list[str]]:
    return {p.name: _IMPORT.findall(p.read_text()) for p in sorted(WEB.glob("*.js"))}


def test_the_page_loads_app_js_as_a_module() -> None:
    assert '<script type="module" src="/web/app.js"></script>' in (WEB / "index.html").read_text()


def test_every_import_names_a_module_beside_it_and_every_module_is_used() -> None:
    g = graph()
    assert all(dep in g for deps in g.values() for dep in deps), g
    seen, todo = set(), ["app.js"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(g[name])
    assert seen == set(g)


def test_the_modules_import_each_other_without_a_cycle() -> None:
    g = graph()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name not in done:
            for dep in g[name]:
                visit(dep, (*path, name))
            done.add(name)

    for name in g:
        visit(name, ())
