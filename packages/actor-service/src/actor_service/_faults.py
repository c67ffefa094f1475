"""Filters in front of `monarch.actor.unhandled_fault_hook`, and the one that keeps
"undeliverable message" failures about a service's replicas from exiting the controller.

Monarch hands the failures no supervisor handled to `unhandled_fault_hook`, whose default
exits the process. A program that expects some failures (a replica it killed, a process it
restores) puts a filter in front of whatever hook is installed: the filter drops the
failures it expects and passes every other one on (`FaultFilter`).

One kind of failure reaches the *sender* of a message instead of a service's supervisor: a
call sent to a replica actor that has already failed while its process lives on (for
example an actor whose `__init__` raised) comes back undeliverable, and the root client,
which has no handler for that, passes it to the hook. The caller of such a call already gets
a `SupervisionError` and the service treats the replica as dead, so `watch` drops
undeliverable-message failures whose destination is a mesh of a live service.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

import monarch.actor
from monarch.actor import MeshFailure

log = logging.getLogger(__name__)


class FaultFilter:
    """Drops the Monarch failures `drop` says are expected, each logged at INFO as `name`
    (what such a failure means, e.g. "a trainer process failed") and the failure, and passes
    every other one to the hook it was put in front of.

    `install` may be called any number of times, also after other code put its own filter in
    front of this one: it then goes in front again, and a failure that meets this filter a
    second time on its way down the chain continues from where the filter was installed the
    time before, so the chain never loops back on itself."""

    def __init__(self, name: str, drop: Callable[[MeshFailure], bool]) -> None:
        self.name, self._drop = name, drop
        self._below: list[Callable[[MeshFailure], None]] = []  # the hooks, one per install
        self._visits = threading.local()  # how often the failure in hand met this filter

    def install(self) -> None:
        """Puts the filter in front of the installed hook, unless it is already in front."""
        if monarch.actor.unhandled_fault_hook is not self:
            self._below.append(monarch.actor.unhandled_fault_hook)
            monarch.actor.unhandled_fault_hook = self

    def __call__(self, failure: MeshFailure) -> None:
        if self._drop(failure):
            log.info("%s: %s", self.name, failure)
            return
        visit = getattr(self._visits, "n", 0)
        # The k-th meeting (from 0) is the install k from the newest: go on below that one.
        below = self._below[max(len(self._below) - 1 - visit, 0)]
        self._visits.n = visit + 1
        try:
            below(failure)
        finally:
            self._visits.n = visit


_UNDELIVERABLE = re.compile(r"undeliverable message for (\S+?)\.")
_prefixes: set[str] = set()


def _undeliverable_to_a_service(failure: MeshFailure) -> bool:
    match = _UNDELIVERABLE.search(str(failure))
    return match is not None and any(match.group(1).startswith(p) for p in _prefixes)


_services = FaultFilter("a message to a dead replica", _undeliverable_to_a_service)


def watch(prefix: str) -> None:
    """Undeliverable messages to meshes named `prefix...` stop being fatal."""
    _services.install()
    # Never removed: a late reply can still bounce after the service shut down.
    _prefixes.add(prefix)
