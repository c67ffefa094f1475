"""Every workspace member builds a wheel that installs and imports as users get it.

Each member's wheel is built fresh (`uv build`) and installed, without dependencies, into a
throwaway virtual environment. That environment borrows the dependencies (torch, Monarch,
...) from the environment running this test by a path entry, not by reinstalling them: the
path is appended after the new environment's own site-packages and its `.pth` files are not
run, so the members' editable installs in the borrowed environment stay off `sys.path` and
each import can only come from the installed wheel.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _projects() -> dict[str, str]:
    """Distribution name -> version in its pyproject.toml, for every workspace member."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        patterns = tomllib.load(f)["tool"]["uv"]["workspace"]["members"]
    projects: dict[str, str] = {}
    for pattern in patterns:
        for path in sorted(glob.glob(str(ROOT / pattern / "pyproject.toml"))):
            with open(path, "rb") as f:
                project = tomllib.load(f)["project"]
            projects[project["name"]] = project["version"]
    return projects


VERSIONS = _projects()
MEMBERS = {name: name.replace("-", "_") for name in VERSIONS}  # distribution -> module

# Runs in the throwaway environment: where each module and its distribution come from.
PROBE = """
import importlib, importlib.metadata, json, sys, sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"]).resolve()
found = {}
for dist_name, module_name in json.loads(sys.argv[1]).items():
    module = importlib.import_module(module_name)
    dist = importlib.metadata.distribution(dist_name)
    file = Path(module.__file__).resolve()
    recorded = {Path(str(dist.locate_file(f))).resolve() for f in dist.files or ()}
    found[dist_name] = {
        "file": str(file),
        "in_site": file.is_relative_to(site),
        "in_record": file in recorded,
        "version": getattr(module, "__version__", None),
        "metadata_version": dist.version,
        "py_typed": (file.parent / "py.typed") in recorded,
    }
print(json.dumps(found))
"""


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is needed to build the wheels; run through `uv run` or put uv on PATH")
    return uv


def _run(*cmd: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_members_are_found() -> None:
    assert set(MEMBERS) >= {
        "replay-buffer",
        "rdma-tensor",
        "actor-service",
        "dtensor-reshard",
        "async-grpo",
    }


def test_every_member_imports_from_its_installed_wheel(tmp_path: Path) -> None:
    uv = _uv()
    wheels: list[str] = []
    for dist_name, module_name in MEMBERS.items():
        out = tmp_path / "dist" / dist_name
        _run(uv, "build", "--quiet", "--package", dist_name, "--wheel", "-o", str(out), cwd=ROOT)
        built = sorted(out.glob("*.whl"))
        assert [w.name.split("-")[0] for w in built] == [module_name], built
        wheels.append(str(built[0]))

    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    _run(uv, "venv", "--quiet", "--python", sys.executable, str(venv), cwd=tmp_path)
    install = ("pip", "install", "--quiet", "--offline", "--no-deps", "--python", python)
    _run(uv, *install, *wheels, cwd=tmp_path)
    # Plain path lines only: a .pth file does not run the .pth files of a path it adds.
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv)
    borrowed = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(site.strip()) / "_borrowed.pth").write_text("".join(f"{p}\n" for p in borrowed))

    found = json.loads(_run(python, "-c", PROBE, json.dumps(MEMBERS), cwd=tmp_path))
    for dist_name, where in found.items():
        assert where["in_site"], f"{dist_name} imported from {where['file']}, not the wheel"
        assert where["in_record"], f"{dist_name}: {where['file']} is not a file of its wheel"
        assert where["version"] == where["metadata_version"], (dist_name, where)
        assert where["metadata_version"] == VERSIONS[dist_name], (dist_name, where)
        assert where["py_typed"], f"{dist_name}'s wheel lacks py.typed"
    assert set(found) == set(MEMBERS)
