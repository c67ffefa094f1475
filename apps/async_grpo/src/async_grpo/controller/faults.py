"""The trainer's death, as the controller sees it: `TrainerDied`, and the one hook that keeps
Monarch from exiting the controller when it happens.

The trainer's processes are spawned by the controller itself, so Monarch reports their
failure to the controller's `monarch.actor.unhandled_fault_hook`, whose default exits: the
whole run would be lost with one process. `tolerate_trainer_deaths` puts a filter in front
of whatever hook is installed that drops the failures of the trainer's meshes (its actor,
Monarch's per-process log forwarder, the SPMD set-up actor of a sharded trainer) and passes
every other failure on. The death itself reaches the run as `TrainerDied`, raised by the
next call to the trainer (`components.TrainerMesh`), and the run restores the trainer from
its last checkpoint (`recovery.py`). (Every other process is a service replica, whose
failures its service's own supervisor handles.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import monarch.actor
from monarch.actor import MeshFailure

log = logging.getLogger(__name__)

# Mesh names start with the name given at spawn; Monarch's own actors on every process the
# controller spawns are its log forwarders ("logger") and, sharded, "_SPMDActor".
TRAINER_MESHES = ("trainer", "logger", "_SPMDActor")

_previous: list[Callable[[MeshFailure], None]] = []


class TrainerDied(RuntimeError):
    """A trainer process died (or was found dead); the message is Monarch's reason."""


def _hook(failure: MeshFailure) -> None:
    if failure.mesh_name.startswith(TRAINER_MESHES):
        log.info("a trainer process failed: %s", failure)
        return
    _previous[-1](failure)


def tolerate_trainer_deaths() -> None:
    """Installs the filter (once per process)."""
    if monarch.actor.unhandled_fault_hook is not _hook:
        _previous.append(monarch.actor.unhandled_fault_hook)
        monarch.actor.unhandled_fault_hook = _hook
