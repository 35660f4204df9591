"""A non-editable install must still find schema/: it ships inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from queen_trio.db.migrations import discover, discover_functions

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_contains_schema_and_queries(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=120,
    )
    (wheel,) = tmp_path.glob("queen_trio-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for migration in discover():
        assert f"queen_trio/schema/{migration.version:03d}_{migration.name}.sql" in names
    functions = discover_functions()
    assert functions
    for function_file in functions:
        assert f"queen_trio/schema/functions/{function_file.name}" in names
    assert "queen_trio/sql/migrations.sql" in names
    assert "queen_trio/sql/ops.sql" in names
    for asset in ("index.html", "app.js", "app.css"):  # the dashboard at /ui
        assert f"queen_trio/ui/{asset}" in names


def _base_closure() -> set[str]:
    """The distributions `pip install -e .` brings in: queen-trio's requirements without
    extras, and theirs, as installed here."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = ["queen-trio"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append(req.name)
            if req.extras:  # e.g. psycopg[binary], hypercorn[trio]
                for extra_line in metadata.requires(req.name) or []:
                    extra_req = Requirement(extra_line)
                    if extra_req.marker is not None and any(
                            extra_req.marker.evaluate({"extra": e}) for e in req.extras):
                        todo.append(extra_req.name)
    return seen


def test_the_broker_runs_without_the_dev_extra() -> None:
    """Everything queen_trio/ imports comes with `pip install -e .` (`.[dev]` is for tests)."""
    import ast
    from importlib import metadata

    from packaging.utils import canonicalize_name

    imported: set[str] = set()
    for path in (REPO / "queen_trio").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"queen_trio"}
    providers = metadata.packages_distributions()
    closure = _base_closure()
    missing = {name: providers.get(name) for name in third_party
               if not {canonicalize_name(d) for d in providers.get(name, [])} & closure}
    assert not missing, f"queen_trio/ imports what `pip install -e .` lacks: {missing}"
    # And none of it is only in the dev extra.
    assert {"pytest", "testcontainers", "hypothesis", "schemathesis"}.isdisjoint(third_party)


def test_license_changelog_and_python_versions_agree() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "MIT"}
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    assert "License :: OSI Approved :: MIT License" in project["classifiers"]
    assert f"## {project['version']}" in (REPO / "CHANGELOG.md").read_text()
    # requires-python, the classifiers and the README name the same oldest version.
    assert project["requires-python"] == ">=3.11"
    assert "Programming Language :: Python :: 3.11" in project["classifiers"]
    readme = (REPO / "README.md").read_text()
    assert "Python 3.11 or newer" in readme
    assert "(RELIABILITY.md)" in readme and "(CHANGELOG.md)" in readme
