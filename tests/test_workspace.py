"""Structural rules of the workspace that no single package can check on its own."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
MEMBERS = [*PACKAGES, ROOT / "apps" / "async_grpo"]


def _project(member: Path) -> dict[str, object]:
    with (member / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    assert isinstance(project, dict)
    return project


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_member_is_a_complete_distribution() -> None:
    assert len(PACKAGES) == 5
    for member in MEMBERS:
        module = str(_project(member)["name"]).replace("-", "_")
        assert (member / "src" / module / "py.typed").is_file(), member
        assert (member / "src" / module / "__init__.py").is_file(), member
        for name in ("README.md", "CHANGELOG.md"):
            assert (member / name).is_file(), f"{member.name} lacks {name}"
        assert any((member / "tests").glob("test_*.py")), f"{member.name} has no tests"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_packages_never_import_the_app(package: Path) -> None:
    for source in package.rglob("*.py"):
        assert "async_grpo" not in _imported_modules(source), f"{source} imports the app"


def test_sibling_dependencies_have_a_lower_bound_and_a_workspace_source() -> None:
    names = {str(_project(m)["name"]) for m in MEMBERS}
    for member in MEMBERS:
        with (member / "pyproject.toml").open("rb") as f:
            data = tomllib.load(f)
        deps = data["project"].get("dependencies", [])
        sources = data.get("tool", {}).get("uv", {}).get("sources", {})
        for dep in deps:
            name = dep.split(">")[0].split("=")[0].split("<")[0].strip()
            if name in names:
                assert ">=" in dep, f"{member.name}: {dep} needs a lower bound"
                assert sources.get(name) == {"workspace": True}, f"{member.name}: {name} source"
