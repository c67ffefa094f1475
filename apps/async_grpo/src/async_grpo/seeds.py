"""Seeds derived from names and numbers, the same in every process."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from `parts`, the same in every process and Python version (unlike
    `hash`): distinct parts give independent streams."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
