"""Finding the model before any process is spawned, without downloading anything.

`--model` names a local directory (it must hold `config.json`), or a Hugging Face hub id
that is already in the local Hugging Face cache: every process then loads that cached
snapshot's directory, and nothing touches the network. A hub id that is not cached is a
one-line error that says how to get the model into a directory on a machine that reaches
the hub (`hf download ID --local-dir DIR`), and to give `--model DIR`: a run never
downloads weights itself (a download of gigabytes is the user's decision, and on a machine
without the hub it would wait on retries for minutes).
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

# "name" or "owner/name" (the hub's rule): anything else is a filesystem path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class ModelNotFound(ValueError):
    """The model is neither a usable local directory nor a hub id in the local cache."""


def locate_model(path: str) -> str:
    """The directory every process loads the model from with `from_pretrained`: `path`
    itself, or the cached snapshot of hub id `path`. Raises `ModelNotFound` naming what was
    tried and how to get the model; never touches the network."""
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelNotFound(_missing(path, "no config.json there"))
        return str(local)
    if not _HUB_ID.fullmatch(path) or ".." in path:
        raise ModelNotFound(_missing(path, "no such directory"))
    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        return str(Path(cached).parent)
    raise ModelNotFound(
        f"model {path!r} is not a local directory and not in the Hugging Face cache, and a "
        f"run downloads nothing: on a machine that reaches the hub, `hf download {path} "
        f"--local-dir DIR`, then give --model DIR (or --model.random_weights true for the "
        "architecture with random weights, or --preset tiny)"
    )


def _missing(path: str, why: str) -> str:
    return (
        f"model not found: {path!r} ({why}). Give a local directory with --model PATH, "
        "--model.random_weights true to build the architecture with random weights, or "
        "--preset tiny"
    )
