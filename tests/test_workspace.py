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
        assert any((member / "tests").rglob("test_*.py")), f"{member.name} has no tests"


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


def _module_graph(src: Path) -> dict[str, set[str]]:
    """Every module of the package in `src` -> the modules of it that it imports: every
    import statement, at any depth (in a function, under `TYPE_CHECKING`); `from pkg import
    name` counts `pkg.name` when that is a module, else `pkg` itself."""
    modules = {
        ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
        for p in src.rglob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [t for t in subs if t in modules]
                if len(targets) < len(subs):
                    targets.append(node.module)
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (as the modules along it), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            if (found := visit(target)) is not None:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if (found := visit(module)) is not None:
            return found
    return None


@pytest.mark.parametrize("member", MEMBERS, ids=lambda p: p.name)
def test_no_module_imports_one_that_imports_it_back(member: Path) -> None:
    # Not even under TYPE_CHECKING, nor lazily inside a function.
    (src,) = [p for p in (member / "src").iterdir() if p.is_dir()]
    cycle = _cycle(_module_graph(src.parent))
    assert cycle is None, " -> ".join(cycle or [])


# The app's subpackages from the top down: a module imports only from its own subpackage or
# from those below it (CONTRIBUTING.md, "Layout of the app").
APP_LAYERS = [
    "cli",
    "train",
    "controller",
    "launch",
    "observability",
    "actors",
    "generation",
    "checkpoint",
    "weight_sync",
    "grpo",
    "tasks",
    "config",
    "model",
    "tracing",
    "seeds",
]


def test_the_apps_subpackages_import_only_downwards() -> None:
    src = ROOT / "apps" / "async_grpo" / "src"
    graph = _module_graph(src)

    def layer(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "async_grpo"

    present = {layer(m) for m in graph} - {"async_grpo"}
    assert present == set(APP_LAYERS), present ^ set(APP_LAYERS)
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if layer(b) != "async_grpo"
        and layer(a) != "async_grpo"
        and APP_LAYERS.index(layer(b)) < APP_LAYERS.index(layer(a))
    ]
    assert not upward, upward
