"""The `hosts` argument of `spawn_service`: checked, and split into single hosts."""

from __future__ import annotations

from collections.abc import Sequence

from monarch.actor import HostMesh

_FLAT = "host"  # the dimension a host mesh is flattened into before it is split


def single_hosts(hosts: object) -> list[HostMesh]:
    """The hosts of `hosts` (a `HostMesh`, or a list or tuple of them), one single-host
    mesh each, in order: a mesh of several hosts contributes each of its hosts, row-major.

    Raises before anything is spawned: `TypeError` for something that is not a host mesh
    (or a list / tuple of them), `ValueError` for no hosts at all.
    """
    meshes: Sequence[object]
    if isinstance(hosts, HostMesh):
        meshes = [hosts]
    elif isinstance(hosts, list | tuple):
        meshes = hosts
    else:
        raise TypeError(
            "spawn_service: hosts must be a HostMesh or a list of them (e.g. "
            f"[job.state().a, job.state().b]), got {type(hosts).__name__}"
        )
    if not meshes:
        raise ValueError(
            "spawn_service: hosts is empty; give at least one host mesh, or leave hosts out "
            "to run every replica on this host"
        )
    found: list[HostMesh] = []
    for position, mesh in enumerate(meshes):
        if not isinstance(mesh, HostMesh):
            raise TypeError(
                f"spawn_service: hosts[{position}] is not a monarch HostMesh (got "
                f"{type(mesh).__name__})"
            )
        flat = mesh.flatten(_FLAT)
        found += [flat.slice(**{_FLAT: i}) for i in range(flat.size(_FLAT))]
    return found
