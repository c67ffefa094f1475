"""Every check the project runs, as nox sessions. `uv run nox` runs the default set.

Per-member sessions install ONLY that member, its declared dependencies (exact versions from
`uv.lock`) and the test tools into a virtual environment of their own, so an import a member
forgot to declare fails here instead of on a user's machine. `tests` installs the member the
way users get it, as a freshly built wheel (plus the wheels of the siblings it declares), so
every member's wheel passes its own tests outside the workspace; `typecheck` checks the
sources, installed editable.

    uv run nox                                   # the default set, as CI runs it
    uv run nox -s "tests(package='replay-buffer')"
    uv run nox -s typecheck -- rdma-tensor       # mypy on those named (default: all)
    uv run nox -s "bench(package='rdma-tensor')" -- --quick
    uv run nox -l                                # list every session
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nox

# tools/ is a folder of scripts, not a package: its nox helpers are imported by path.
sys.path.insert(0, str(Path(__file__).parent / "tools"))
from nox_envs import (
    COMPILE,
    ENVS,
    MEMBERS,
    activated,
    make_env,
    member_env,
    run_in,
    wheel_env,
    workspace_env,
)
from nox_support import (
    UV,
    rehearsal_env,
    rehearsal_problems,
    run_apart,
    run_together,
)

ROOT = Path(__file__).parent

nox.options.sessions = [
    "lint",
    "typecheck",
    "libraries",
    "tests(package='async-grpo')",
    "integration",
    "examples",
    "browser",
    "vllm",
]
nox.options.default_venv_backend = "none"

nox.options.error_on_external_run = False

# Test files run several at a time (pytest-xdist; a file's tests stay together, so a run
# its tests share is made once): most multi-process tests spend much of their time waiting
# (spawning, supervision, deadlines), so on 2 cores two files at a time take a third less
# wall time, and more where they wait more. Measured on a clean clone: the app's tests
# 1019 s one at a time, 599 s two, 531 s three; actor-service's 134, 89, 64 s, 51 s four
# (they barely use the CPU); rdma-tensor's 58 s one, 43 s two, 50 s three. `-- -n 0`
# runs them one at a time; a later `-n` wins. rl-envs' run one at a time: its sandbox
# tests look for sandboxed processes left behind anywhere on the machine, and would find
# another worker's.
WORKERS = {"async-grpo": 3, "actor-service": 4, "rl-envs": 0}


def _parallel(member: str | None) -> tuple[str, ...]:
    """pytest's options for `member`'s tests (None: any other tests, two at a time): its
    pytest-xdist workers, and the ten slowest tests listed at the end, so the log shows
    where a session's time goes."""
    workers = WORKERS.get(member or "", 2)
    spread = ("-n", str(workers), "--dist", "loadfile") if workers else ()
    return (*spread, "--durations=10")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree (one configuration)."""
    bin_dir = make_env(session, "lint", "--only-group", "dev", "--no-emit-project")
    run_in(session, bin_dir, "ruff", "check", ".")
    run_in(session, bin_dir, "ruff", "format", "--check", ".")


# What `typecheck` checks in the workspace's environment besides the members: the code that
# belongs to none of them.
WORKSPACE_CHECKED = ["tests", "examples", "noxfile.py", "tools/nox_support.py", "tools/nox_envs.py"]


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on each member's src, tests and benchmarks, in that member's own
    environment (its sources installed editable), and on `WORKSPACE_CHECKED` (named
    `workspace`) in the whole workspace's; two at a time: one mypy uses one core, and one
    after the other they left a 2-core machine half idle for a minute and a half.

    `uv run nox -s typecheck -- rdma-tensor workspace` checks those named."""
    names = [*MEMBERS, "workspace"]
    unknown = sorted(set(session.posargs) - set(names))
    if unknown:
        session.error(f"typecheck: nothing named {unknown}; the names: {', '.join(names)}")

    def commands() -> Iterator[list[str]]:
        # The app first: its check is the longest. Each environment is made when its check
        # is next, while the checks before it run.
        for name in sorted(session.posargs or names, key=lambda p: p != "async-grpo"):
            if name == "workspace":
                bin_dir = workspace_env(session)
                targets = WORKSPACE_CHECKED
            else:
                bin_dir = member_env(session, name)
                path = MEMBERS[name]
                dirs = [Path(path, d) for d in ("src", "tests", "benchmarks")]
                targets = [str(d) for d in dirs if any(d.rglob("*.py"))]
            # A cache of its own: two mypys sharing one would each find the other's entries
            # for torch (from another environment) stale and check all of torch again.
            cache = f".mypy_cache/{name}"
            mypy = [str(bin_dir / "mypy"), "--config-file", "pyproject.toml", "--cache-dir", cache]
            yield [*mypy, *targets]

    failed = run_together(commands(), dict(os.environ), width=2, limit_s=600.0, log=session.log)
    if failed:
        session.error(f"typecheck failed: {'; '.join(failed)}")


@nox.session
@nox.parametrize("package", list(MEMBERS))
def tests(session: nox.Session, package: str) -> None:
    """One member's tests against its built wheel, with only its declared dependencies."""
    env = _bubblewrap(session) if package in ("rl-envs", "async-grpo") else {}
    bin_dir = wheel_env(session, package)
    tests = f"{MEMBERS[package]}/tests"
    run_in(session, bin_dir, "pytest", tests, *_parallel(package), *session.posargs, env=env)


# The libraries' tests, longest first (measured on a clean clone of 2 cores, one at a time:
# dtensor-reshard 105 s, rdma-tensor 48, actor-service 52, rl-envs 34, replay-buffer 19).
LIBRARIES = ["dtensor-reshard", "rdma-tensor", "actor-service", "rl-envs", "replay-buffer"]


@nox.session
def libraries(session: nox.Session) -> None:
    """Every library's tests (`tests(package=...)` for each member in packages/), two
    libraries at a time, each one's output shown whole when it ends: one after the other
    they left a 2-core machine idle a third of their 300 s (actor-service's and rl-envs'
    tests mostly wait on deadlines and processes); together they took 270 s on a clean
    clone. rl-envs' sandbox tests look for sandboxed processes on the whole machine: no
    other library starts a sandbox."""
    assert sorted(LIBRARIES) == sorted(m for m, path in MEMBERS.items() if "packages/" in path)
    env = {**os.environ, **_bubblewrap(session)}

    def commands() -> Iterator[list[str]]:
        # Each wheel environment is made when its tests are next, while the ones before run.
        for package in LIBRARIES:
            bin_dir = wheel_env(session, package)
            tests = f"{MEMBERS[package]}/tests"
            yield [str(bin_dir / "pytest"), tests, *_parallel(package), *session.posargs]

    failed = run_together(commands(), env, width=2, limit_s=1200.0, log=session.log)
    if failed:
        session.error(f"library tests failed: {'; '.join(failed)}")


def _bubblewrap(session: nox.Session) -> dict[str, str]:
    """rl-envs' sandbox runs programs in bubblewrap. Installs Debian's `bubblewrap` when it
    is missing and this runs as root with apt-get; with it, the sandbox tests must pass for
    real (RL_ENVS_REQUIRE_SANDBOX=1). Without it they skip, naming the package."""
    if shutil.which("bwrap") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            session.warn("rl-envs sandbox tests skip: install the package `bubblewrap` (as root)")
            return {}
        apt = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-qq", external=True, env=apt)
        session.run("apt-get", "install", "-y", "-qq", "bubblewrap", external=True, env=apt)
    return {"RL_ENVS_REQUIRE_SANDBOX": "1"}


@nox.session
def fast(session: nox.Session) -> None:
    """The fast tier, for while you change code (not in the default set): ruff, then every
    member's tests not marked `slow` (whole runs, and tests that start several processes),
    one pytest per member in one environment holding the whole workspace.

    `uv run nox -s fast` (add `-- -x` to stop at the first failure); the default set runs
    everything, slow tests included."""
    bin_dir = workspace_env(session)
    run_in(session, bin_dir, "ruff", "check", ".")
    run_in(session, bin_dir, "ruff", "format", "--check", ".")
    members: list[tuple[str | None, str]] = [*MEMBERS.items(), (None, "")]
    for member, path in members:
        tests = f"{path}/tests" if member else "tests"
        quick = ("-m", "not slow", "-q", *_parallel(member))
        run_in(session, bin_dir, "pytest", tests, *quick, *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests in `tests/` (type-checked by `typecheck`), with the whole workspace
    installed."""
    bin_dir = workspace_env(session)
    run_in(session, bin_dir, "pytest", "tests", *_parallel(None), *session.posargs)


# Arguments that keep an example CI-sized; every other example runs as a reader would run it.
EXAMPLE_ARGS: dict[str, list[str]] = {"09_async_rl_train.py": ["--steps", "12"]}
EXAMPLE_LIMIT_S = 600.0  # an example still running then is stopped and named


@nox.session
def examples(session: nox.Session) -> None:
    """Runs every numbered example as its own process, as a reader would (`typecheck`
    checks them): two at a time (each waits on processes of its own much of the time),
    each one's output shown whole when it ends."""
    bin_dir = workspace_env(session)
    scripts = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
    if not scripts:
        session.skip("no examples yet")
    commands = [
        [str(bin_dir / "python"), str(script.relative_to(ROOT)), *EXAMPLE_ARGS.get(script.name, [])]
        for script in scripts
    ]
    env = {**os.environ, **activated(bin_dir)}
    failed = run_together(commands, env, width=2, limit_s=EXAMPLE_LIMIT_S, log=session.log)
    if failed:
        session.error(f"examples failed: {'; '.join(failed)}")


@nox.session
def browser(session: nox.Session) -> None:
    """The async-grpo report in headless Chromium: Playwright (dependency group `browser`)
    drives Debian's `chromium`, which Playwright cannot download here. Installs it with
    apt-get when it is missing and this runs as root; otherwise skips, naming the package."""
    if shutil.which("chromium") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            session.skip("needs Chromium: install the Debian package `chromium` (as root)")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-qq", external=True, env=env)
        session.run("apt-get", "install", "-y", "-qq", "chromium", external=True, env=env)
    bin_dir = make_env(
        session, "browser", "--no-dev", "--no-emit-project", "--all-packages", "--group", "browser"
    )
    env = {
        **activated(bin_dir),
        "ASYNC_GRPO_REQUIRE_BROWSER": "1",  # here a missing browser fails instead of skipping
    }
    test = "apps/async_grpo/tests/observability/test_report_browser.py"
    session.run(str(bin_dir / "pytest"), test, *session.posargs, env=env, external=True)


# The vLLM engine's tests: they skip elsewhere (no vLLM), and must run here.
VLLM_TESTS = [
    "apps/async_grpo/tests/generation/test_vllm_engine.py",
    "apps/async_grpo/tests/generation/test_vllm_export.py",
    "apps/async_grpo/tests/generation/test_vllm_lora.py",
    "apps/async_grpo/tests/runs/test_vllm_learning.py",
]


@nox.session
def vllm(session: nox.Session) -> None:
    """The async-grpo vLLM engine's tests (`--generator.engine vllm`) with vLLM's CPU build, in
    an environment synced from the lock's `vllm` extra (`uv sync --extra vllm`). CI has no
    GPU, so this is where the engine runs. (The engine reaches vLLM through `importlib`, so
    `typecheck` checks it without vLLM installed.)"""
    env_dir = ENVS / "vllm"
    session.run(
        UV, "sync", "--frozen", "--quiet", *COMPILE, "--extra", "vllm", "--python", sys.executable,
        env={"UV_PROJECT_ENVIRONMENT": str(env_dir)}, external=True,
    )  # fmt: skip
    bin_dir = env_dir / "bin"
    env = {
        **activated(bin_dir),
        "ASYNC_GRPO_REQUIRE_VLLM": "1",  # here a missing vLLM fails instead of skipping
    }
    pytest = [str(bin_dir / "pytest"), *VLLM_TESTS, *_parallel(None)]
    run_apart(session, [*pytest, *session.posargs], env)


@nox.session
@nox.parametrize("package", list(MEMBERS))
def bench(session: nox.Session, package: str) -> None:
    """Runs every script in one member's `benchmarks/` (not in the default set).

    Extra arguments go to each script, e.g. `-- --quick` or `-- --json out.json`.
    """
    bin_dir = member_env(session, package)
    scripts = sorted((ROOT / MEMBERS[package] / "benchmarks").glob("*.py"))
    if not scripts:
        session.skip(f"{package} has no benchmarks yet")
    for script in scripts:
        if not script.name.startswith("_"):
            run_in(session, bin_dir, "python", str(script), *session.posargs)


@nox.session(name="gpu_rehearsal")
def gpu_rehearsal(session: nox.Session) -> None:
    """Runs tools/gpu_check.sh end to end on this CPU machine, in an environment like the GPU
    machine's (not in the default set; docs/gpu_check.md).

    The environment: Python 3.12 and only packages the GPU machine has, installed from the
    registry before the script runs; any other package pulled in is removed, and the session
    fails if one remains. Then `tools/gpu_bundle.sh` builds .offline/ and the script runs
    with no registry and no network (pip has no index; proxies point nowhere), so every
    import it needs beyond the machine's packages must come from .offline/. It must exit 0,
    with the CUDA parts skipped or shrunk, each saying why.
    """
    env_dir = rehearsal_env(
        session, ENVS / "gpu-rehearsal", ROOT / "tools" / "gpu_device_packages.txt"
    )
    session.run("bash", str(ROOT / "tools" / "gpu_bundle.sh"), external=True)
    out = Path(session.create_tmp()).resolve() / "gpu_check"
    shutil.rmtree(out, ignore_errors=True)
    nowhere = "http://127.0.0.1:9"  # nothing listens there: any download fails at once
    env = {
        "PATH": f"{env_dir / 'bin'}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "GPU_CHECK_WORK": str(out.parent / "work"),
        # Every part, the one a device call runs only when asked for included.
        "GPU_CHECK_PARTS": "setup gpu_tests weight_sync app async_vs_sync",
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "UV_OFFLINE": "1",
        **dict.fromkeys(("http_proxy", "https_proxy", "all_proxy"), nowhere),
        **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"), nowhere),
    }
    start = time.monotonic()
    session.run(
        "bash", str(ROOT / "tools" / "gpu_check.sh"), str(out),
        env=env, include_outer_env=False, external=True,
    )  # fmt: skip
    wall = time.monotonic() - start
    report = json.loads((out / "gpu_check.json").read_text())
    problems = rehearsal_problems(report)
    offline = sum(p.stat().st_size for p in (ROOT / ".offline").rglob("*") if p.is_file())
    session.log(f"rehearsal: {wall:.0f} s wall; .offline/ {offline / 2**20:.1f} MiB; {out}")
    if problems:
        session.error("; ".join(problems))
