"""Keeps "undeliverable message" failures about a service's replicas from exiting the
controller.

The supervisor actor handles the failures of the replica meshes it owns. One kind of
failure reaches the *sender* of a message instead: a call sent to a replica actor that has
already failed while its process lives on (for example an actor whose `__init__` raised)
comes back undeliverable, and the root client, which has no handler for that, passes it to
`monarch.actor.unhandled_fault_hook`, whose default exits the process. The caller of such a
call already gets a `SupervisionError` and the service treats the replica as dead, so this
module chains a hook in front of whatever hook is installed: it drops undeliverable-message
failures whose destination is a mesh of a live service and passes every other failure on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import monarch.actor
from monarch.actor import MeshFailure

log = logging.getLogger(__name__)

_UNDELIVERABLE = re.compile(r"undeliverable message for (\S+?)\.")
_prefixes: set[str] = set()
_previous: list[Callable[[MeshFailure], None]] = []  # the hook ours was put in front of


def _hook(failure: MeshFailure) -> None:
    match = _UNDELIVERABLE.search(str(failure))
    if match is not None and any(match.group(1).startswith(p) for p in _prefixes):
        log.info("dropped a message to a dead replica: %s", match.group(0))
        return
    _previous[-1](failure)


def watch(prefix: str) -> None:
    """Undeliverable messages to meshes named `prefix...` stop being fatal."""
    if monarch.actor.unhandled_fault_hook is not _hook:
        _previous.append(monarch.actor.unhandled_fault_hook)
        monarch.actor.unhandled_fault_hook = _hook
    # Never removed: a late reply can still bounce after the service shut down.
    _prefixes.add(prefix)
