#!/usr/bin/env bash
# Builds .offline/, everything tools/gpu_check.sh installs on a GPU machine that has no
# package registry (Python 3.12, PyTorch and transformers already there). Run it here, on a
# machine that reaches PyPI, from any directory:
#
#   tools/gpu_bundle.sh            # then carry `.offline` in the device call (docs/gpu_check.md)
#
# .offline/monarch-cp312.tar.xz and .offline/wheels/opentelemetry_api-*.whl come from the
# workplace's offline-monarch-bundle tool (shared/tools/ beside the main checkout; set
# MONARCH_BUNDLE_TOOL to use another copy). The other wheels are the pure-Python packages
# the code imports that the GPU machine lacks, at the versions uv.lock pins:
#   tyro, docstring-parser, typeguard   async_grpo's command line (tyro and its requirements)
#   pytest-asyncio                      the tests' asyncio_mode (root pyproject.toml)
# Not carried, because nothing the check runs imports them (the rehearsal, `uv run nox -s
# gpu_rehearsal`, proves it in an environment holding only the GPU machine's packages):
# plotly (only `async-grpo report` and its tests), flask (only `monarch.job`, which the
# check's code paths never import), and torchmonarch's other requirements pyzmq, lark,
# clusterscope and py-spy. Prints the size of .offline/ and of what travels with it.
# Re-running is cheap: the Monarch bundle and wheels already there are kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# `pip download` (here and in the bundle tool) needs an interpreter with pip; `uv run` puts
# the workspace's environment, which has none, first on PATH.
if ! python3 -m pip --version > /dev/null 2>&1; then
    PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/\.venv/' -e '/\.nox/' | paste -sd: -)
    export PATH
    if ! python3 -m pip --version > /dev/null 2>&1; then
        echo "gpu_bundle: needs a python3 with pip on PATH (outside uv's environments)" >&2
        exit 1
    fi
fi
dest=.offline

tool=${MONARCH_BUNDLE_TOOL:-}
if [ -z "$tool" ]; then
    common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
    for candidate in "$root/../shared/tools/offline-monarch-bundle" \
        "${common:+$common/../../shared/tools/offline-monarch-bundle}" \
        "$root/shared/tools/offline-monarch-bundle"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then tool=$candidate; break; fi
    done
fi
if [ -z "$tool" ]; then
    echo "gpu_bundle: offline-monarch-bundle not found beside this checkout; set MONARCH_BUNDLE_TOOL" >&2
    exit 1
fi
"$tool" "$dest" 3.12

# Versions from uv.lock, so the GPU machine runs what the lock tests.
pins=$(python3 - "$root/uv.lock" tyro docstring-parser typeguard pytest-asyncio <<'EOF'
import sys
import tomllib

lock = tomllib.load(open(sys.argv[1], "rb"))
for name in sys.argv[2:]:
    versions = {p["version"] for p in lock["package"] if p["name"] == name}
    if len(versions) != 1:
        sys.exit(f"gpu_bundle: uv.lock pins {name} at {sorted(versions) or 'no version'}")
    print(f"{name}=={versions.pop()}")
EOF
)
missing=()
for pin in $pins; do
    name=${pin%%==*}
    file=${name//-/_}-${pin##*==}-
    compgen -G "$dest/wheels/$file*.whl" > /dev/null || missing+=("$pin")
done
if [ ${#missing[@]} -gt 0 ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d "$dest/wheels" "${missing[@]}"
fi

ls -l "$dest" "$dest/wheels"
offline=$(du -sb "$dest" | cut -f1)
# What a device call sends: tracked files, untracked files git does not ignore, and .offline.
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
limit=$((64 << 20))
total=$((offline + tree))
awk -v o="$offline" -v t="$tree" 'BEGIN { m = 1048576; printf ".offline: %.1f MiB; with the working tree (%.1f MiB): %.1f MiB of the 64 MiB a device call carries\n", o / m, t / m, (o + t) / m }'
if [ "$total" -gt "$limit" ]; then
    echo "gpu_bundle: over the 64 MiB a device call carries" >&2
    exit 1
fi
