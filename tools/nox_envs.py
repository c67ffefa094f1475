"""The virtual environments `noxfile.py`'s checks run in, made from `uv.lock`: a member's own
(its sources editable, its pinned dependencies), a member's wheels', and any other export;
and running a tool inside one."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox
from nox_support import UV

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / ".nox" / "_envs"

# Workspace members: distribution name -> directory.
MEMBERS = {
    "replay-buffer": "packages/replay-buffer",
    "rdma-tensor": "packages/rdma-tensor",
    "actor-service": "packages/actor-service",
    "dtensor-reshard": "packages/dtensor-reshard",
    "rl-envs": "packages/rl-envs",
    "async-grpo": "apps/async_grpo",
}

# Extras a member's own sessions install, so its optional features are checked too.
MEMBER_EXTRAS: dict[str, tuple[str, ...]] = {
    "rl-envs": ("--extra", "openenv"),
    "async-grpo": ("--extra", "openenv", "--extra", "wandb"),
}


# Bytecode written at install: every test process imports torch and transformers, and where
# PYTHONDONTWRITEBYTECODE is set (CI's image sets it) each one compiled them again, 14 s of
# CPU a process against 6 s with bytecode on disk (2-core Intel Xeon VM).
COMPILE = ("--compile-bytecode",)


def export(*args: str) -> str:
    """Pinned requirements from uv.lock (`--frozen`: never re-resolve inside a check)."""
    cmd = [UV, "export", "--frozen", "--no-hashes", "--no-header", *args]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def make_env(
    session: nox.Session, name: str, *export_args: str, compile_bytecode: bool = True
) -> Path:
    """A virtual environment holding `uv export <export_args>` plus the dev tools, with
    bytecode written unless `compile_bytecode` is False.

    Rebuilt only when the requirements (and so the lock) change; the stamp file records the
    hash of what was installed. Returns the environment's `bin` directory.
    """
    requirements = export(*export_args) + export("--only-group", "dev", "--no-emit-project")
    compile_args = COMPILE if compile_bytecode else ()
    digest = hashlib.sha256((requirements + " ".join(compile_args)).encode()).hexdigest()
    env = ENVS / name
    stamp = env / "requirements.sha256"
    if not (stamp.exists() and stamp.read_text() == digest):
        shutil.rmtree(env, ignore_errors=True)
        session.run(UV, "venv", "--quiet", "--python", sys.executable, str(env))
        req = env / "requirements.txt"
        req.write_text(requirements)
        session.run(
            UV, "pip", "install", "--quiet", *compile_args, "--python", str(env / "bin" / "python"),
            "-r", str(req),
        )  # fmt: skip
        stamp.write_text(digest)
    return env / "bin"


def workspace_env(session: nox.Session) -> Path:
    """Every member's sources installed editable, with all their pinned dependencies."""
    return make_env(session, "workspace", "--no-dev", "--no-emit-project", "--all-packages")


def member_env(session: nox.Session, package: str) -> Path:
    """The member's sources installed editable, with its pinned dependencies (no bytecode:
    in the default set only mypy uses it, and mypy reads sources; compiling took ~30 s each)."""
    extras = MEMBER_EXTRAS.get(package, ())
    return make_env(
        session, package, "--package", package, "--no-dev", *extras, compile_bytecode=False
    )


def wheel_env(session: nox.Session, package: str) -> Path:
    """The member and the siblings it declares installed from freshly built wheels."""
    third_party = ("--package", package, "--no-dev", "--no-emit-workspace")
    bin_dir = make_env(session, f"wheel-{package}", *third_party, *MEMBER_EXTRAS.get(package, ()))
    # Workspace members appear as editable lines in the member's export.
    dirs = [
        line.split("/")[-1]
        for line in export("--package", package, "--no-dev").splitlines()
        if line.startswith("-e ")
    ]
    siblings = [name for name, path in MEMBERS.items() if Path(path).name in dirs]
    dist = Path(session.create_tmp()).resolve() / "wheels"
    shutil.rmtree(dist, ignore_errors=True)
    for name in siblings:
        session.run(UV, "build", "--package", name, "--wheel", "--quiet", "-o", str(dist))
    session.run(
        UV, "pip", "install", "--quiet", "--reinstall", "--no-deps", *COMPILE,
        "--python", str(bin_dir / "python"), *map(str, sorted(dist.glob("*.whl"))),
    )  # fmt: skip
    module = package.replace("-", "_")
    check = f"import {module}; assert 'site-packages' in {module}.__file__, {module}.__file__"
    run_in(session, bin_dir, "python", "-c", check)
    return bin_dir


def activated(bin_dir: Path) -> dict[str, str]:
    """The variables that make the environment of `bin_dir` the active one."""
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return {"VIRTUAL_ENV": str(bin_dir.parent), "PATH": path}


def run_in(
    session: nox.Session, bin_dir: Path, tool: str, *args: str, env: dict[str, str] | None = None
) -> None:
    """Runs `tool` of the environment of `bin_dir`, with that environment active."""
    env = {**(env or {}), **activated(bin_dir)}
    session.run(str(bin_dir / tool), *args, env=env, external=True)
