"""pyproject.toml admits no release of a dependency with a known CVE that the floors below
were raised over (the advisory each one fixes is named beside it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# package -> (the first release without the advisory, the advisory)
FIXED = {
    "aiohttp": ("3.12.14", "CVE-2025-53643 request smuggling; CVE-2024-30251, CVE-2024-52304"),
    "pillow": ("11.3", "CVE-2025-48379 DDS overflow; CVE-2024-28219"),
    "cryptography": ("44.0.1", "CVE-2024-12797 in its bundled OpenSSL"),
    "setuptools": ("78.1.1", "CVE-2025-47273 path traversal"),
}


def _requirements() -> dict[str, Requirement]:
    doc = tomllib.loads(PYPROJECT.read_text())
    listed = [*doc["build-system"]["requires"], *doc["project"]["dependencies"],
              *(r for extra in doc["project"]["optional-dependencies"].values() for r in extra)]
    return {req.name.lower(): req for req in map(Requirement, listed)}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_the_floor_is_above_every_release_with_a_known_cve(name: str) -> None:
    req = _requirements()[name]
    fixed, advisory = FIXED[name]
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert floors and min(floors) >= Version(fixed), f"{req} admits releases before {fixed} ({advisory})"
