"""The lock that `make up`, `make test` and CI install from: every dependency pyproject.toml
asks for, at a version it allows, with its files' hashes; the Debian packages at theirs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "lock" / "python.txt"


def _pins() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes), read from the lock's entries (a line continued by ``\\``)."""
    text = LOCK.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, version = re.match(r"([A-Za-z0-9._-]+)==([^\s;]+)", line).groups()  # type: ignore[union-attr]
            pins[canonicalize_name(name)] = (version, re.findall(r"--hash=sha256:(\w{64})", line))
    return pins


def _wanted() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    wanted = [*project["project"]["dependencies"], *extras["dev"], *extras["mcp"]]
    wanted += project["build-system"]["requires"]  # ppf is built by the lock's setuptools
    return [r for r in map(Requirement, wanted) if canonicalize_name(r.name) != "ppf"]


def test_the_lock_pins_every_dependency_at_an_allowed_version_with_its_hashes() -> None:
    """Each of pyproject.toml's requirements (runtime, dev, mcp, the build's) is in the
    lock at a version its specifier admits, and every entry has its files' hashes."""
    pins, env = _pins(), default_environment()
    assert len(pins) > 50, "the lock lost its entries"
    for name, (_version, hashes) in pins.items():
        assert hashes, f"{name} is pinned without a hash"
        assert name != "ppf", "ppf itself comes from the tree, not the lock"
    for req in _wanted():
        if req.marker is not None and not req.marker.evaluate(dict(env)):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is missing from lock/python.txt: run make lock"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"the lock pins {name}=={pins[name][0]}, pyproject.toml asks for {req}: run make lock"
        )


def test_make_installs_from_the_lock_checking_hashes_and_resolves_nothing_again() -> None:
    """The Makefile takes pip at the lock's version first (a venv's own pip may refuse
    the lock), then the lock with hashes required, then ppf without its deps."""
    make = (ROOT / "Makefile").read_text()
    assert make.index("-r $(PIP)") < make.index("-r $(LOCK)"), "pip comes first"
    pip = (ROOT / "lock" / "pip.txt").read_text().replace("\\\n", " ")
    assert re.search(r"^pip==\S+ (\s*--hash=sha256:\w{64})+", pip, re.M), "pip without hashes"
    assert "pip install -q --require-hashes -r $(LOCK)" in make
    assert "pip install -q --no-deps --no-build-isolation -e ." in make
    assert "--upgrade pip" not in make, "a pip of the day's version is not the lock's"


def test_the_debian_packages_the_tests_use_are_recorded_with_their_versions() -> None:
    """lock/debian.txt names a version for each package the integration tests use."""
    lines = (ROOT / "lock" / "debian.txt").read_text().split()
    recorded = dict(line.split("=", 1) for line in lines)
    for package in ("chromium", "squid", "tinyproxy", "microsocks", "dante-server", "iproute2"):
        assert re.match(r"\d", recorded.get(package, "")), f"{package} has no recorded version"
