"""Finding a checkpoint before any process is spawned, failing fast when it cannot be had.

`transformers`' own loaders retry the network for a minute and more before they give up on a
hub id they cannot reach; a user who mistyped a path, or runs on a host without network,
should hear that in about a second. So `locate_checkpoint` decides in order: a local
directory (must hold `config.json`); a path-looking string that does not exist (an error at
once: it is not a hub id); a hub id already in the local Hugging Face cache; a hub id when
`HF_HUB_OFFLINE` is set (an error at once); otherwise one metadata request to the hub with a
short timeout and no retries.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

HUB_TIMEOUT_S = 5.0
# "name" or "owner/name" (the hub's rule): anything else is a filesystem path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class CheckpointNotFound(ValueError):
    """The model path is neither a usable local directory nor a hub id that can be fetched."""


def missing_message(path: str, why: str = "") -> str:
    """The message for a checkpoint that cannot be found; `why` says what was tried."""
    reason = f" ({why})" if why else ""
    return (
        f"model checkpoint not found: {path!r}{reason}. Give a local directory with "
        "--model PATH, use --model.random_weights true to build the architecture with random "
        "weights, or run the CPU-sized preset with --preset tiny."
    )


def _offline() -> bool:
    # Read at call time: huggingface_hub reads it once at import.
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in ("1", "ON", "YES", "TRUE")


def locate_checkpoint(path: str, timeout_s: float = HUB_TIMEOUT_S) -> str:
    """Returns `path` when every process will be able to load it with `from_pretrained`.

    Raises `CheckpointNotFound` naming what was tried. Touches the network only for a hub id
    that is not cached, with `HF_HUB_OFFLINE` unset: one request of at most `timeout_s`.
    """
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise CheckpointNotFound(missing_message(path, "no config.json there"))
        return str(local)
    if not _HUB_ID.fullmatch(path) or ".." in path:
        raise CheckpointNotFound(missing_message(path, "no such directory"))
    if isinstance(try_to_load_from_cache(path, "config.json"), str):
        return path
    if _offline():
        why = "not a local directory, not in the Hugging Face cache, and HF_HUB_OFFLINE is set"
        raise CheckpointNotFound(missing_message(path, why))
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        get_hf_file_metadata(
            hf_hub_url(path, "config.json", endpoint=endpoint),
            timeout=timeout_s,
            retry_on_errors=False,
        )
    except Exception as e:  # network errors, 401/404 from the hub: all mean "cannot fetch"
        why = f"not a local directory, not cached, and the hub said: {type(e).__name__}: {e}"
        raise CheckpointNotFound(missing_message(path, why)) from None
    return path
