"""Where each component runs: named Monarch host meshes, and which of them each component
is placed on (`--placement.*`).

A run names its host meshes and how many hosts each has (`placement.hosts`, "a=1,b=2"),
and places every component on one of them, or a service on several (`placement.components`,
"trainer=a,generator=b+c,*=c"). The launcher (`placement.launcher`) turns the names into
host meshes: this host for every name (`local`), subprocesses of this machine acting as
hosts (`process`), nodes of a SLURM job (`slurm`) or pods of a Kubernetes cluster
(`kubernetes`); `launchers.py` does that. This module is pure, no Monarch: it parses and
checks the placement against what the run will spawn (`plan_placement`), before anything
is spawned, and says where everything will be (`describe`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping

from async_grpo.config.placement import Launcher, PlacementConfig

COMPONENTS = ("trainer", "generator", "reward", "env", "buffer", "dataset", "reference")
"""Every component a run may start (`env`: every environment service of `--env.tasks`)."""


SERVICES = frozenset({"generator", "reward", "env"})
"""Components served by replicas (`actor-service`): they may be given several host meshes,
their replicas spread round-robin over every host of them, and a replica whose host is gone
restarts on another. The rest cannot move off a dead host."""


_MESH_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")


# Monarch's KubernetesJob names a MonarchMesh after each host mesh: an RFC 1123 label.
_K8S_MESH_NAME = re.compile(r"[a-z][a-z0-9]{0,62}")


class PlacementError(ValueError):
    """The placement names an unknown component or host mesh, or cannot hold the run."""


@dataclasses.dataclass(frozen=True)
class Demand:
    """What one component starts in this run: `count` processes (trainer), replicas (a
    service: per environment for `env`) or 1; 0 when the run does not start it."""

    count: int
    services: int = 1


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """A checked placement. `meshes`: host mesh -> hosts, in the order given;
    `components`: every started component -> the meshes it runs on; `demands`: what each
    started component starts; `call_timeout_s`: the service call timeout (None: none, and
    always None on launcher local, where a host cannot die alone)."""

    launcher: Launcher
    meshes: Mapping[str, int]
    components: Mapping[str, tuple[str, ...]]
    demands: Mapping[str, Demand]
    split_machines: bool
    call_timeout_s: float | None
    gpus_per_host: int = 0
    """GPUs of each host, as a scheduler launcher requests them (0 for local and process)."""
    spawn_timeout_s: float = 30.0
    """How long a service's replica may take to start on one host before the host is marked
    down and the next one tried (`placement.spawn_timeout_s`)."""

    def hosts_of(self, component: str) -> list[tuple[str, int]]:
        """Every host `component` may run on, as (mesh, host index), in order: the order in
        which a service spreads its replicas (replica `i` on host `i % n`)."""
        return [(m, i) for m in self.components[component] for i in range(self.meshes[m])]

    def trainer_per_host(self, procs: int) -> int:
        """A trainer of `procs` processes has this many on each host of its mesh (checked
        to divide evenly for the run's trainer)."""
        return procs // len(self.hosts_of("trainer"))


def parse_hosts(spec: str, launcher: Launcher = "local") -> dict[str, int]:
    """ "a=1,b=2" -> {"a": 1, "b": 2}, in order. Names: a letter, then letters, digits or
    `_` (on Kubernetes, where a mesh names its pods, lowercase letters and digits only)."""
    meshes: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        name, eq, raw = part.partition("=")
        name = name.strip()
        if not eq or not raw.strip().isdigit():
            raise PlacementError(
                f'placement.hosts: {part!r} is not NAME=COUNT (e.g. "trainer=1,gen=2")'
            )
        if not _MESH_NAME.fullmatch(name):
            raise PlacementError(
                f"placement.hosts: mesh name {name!r} must be a letter, then letters, digits "
                "or _ (at most 63)"
            )
        if launcher == "kubernetes" and not _K8S_MESH_NAME.fullmatch(name):
            raise PlacementError(
                f"placement.hosts: mesh name {name!r}: on Kubernetes a mesh names its pods, "
                "so lowercase letters and digits only, starting with a letter"
            )
        if name in meshes:
            raise PlacementError(f"placement.hosts: host mesh {name!r} is given twice")
        if int(raw) < 1:
            raise PlacementError(f"placement.hosts: host mesh {name!r} needs at least 1 host")
        meshes[name] = int(raw)
    return meshes


def parse_components(spec: str, meshes: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
    """ "trainer=a,generator=b+c,*=c" -> every component's meshes. A component not named
    goes where `*` says, else to the first mesh; the reference model, not named, goes with
    the trainer. Unknown components and meshes are errors;
    whether one component may run on several meshes is `plan_placement`'s to check."""
    named: dict[str, tuple[str, ...]] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        who, eq, where = part.partition("=")
        who = who.strip()
        if not eq or not where.strip():
            raise PlacementError(
                f'placement.components: {part!r} is not COMPONENT=MESH (e.g. "trainer=a")'
            )
        if who != "*" and who not in COMPONENTS:
            close = difflib.get_close_matches(who, COMPONENTS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PlacementError(
                f"placement.components: unknown component {who!r}{hint}; components: "
                f"{', '.join(COMPONENTS)}, or * for the rest"
            )
        if who in named:
            raise PlacementError(f"placement.components: {who!r} is placed twice")
        names = tuple(m.strip() for m in where.split("+"))
        for mesh in names:
            if mesh not in meshes:
                raise PlacementError(
                    f"placement.components: {part!r} names host mesh {mesh!r}, which "
                    f"placement.hosts does not define (defined: {', '.join(meshes)})"
                )
        if len(set(names)) != len(names):
            raise PlacementError(f"placement.components: {part!r} names a host mesh twice")
        named[who] = names
    rest = named.pop("*", (next(iter(meshes)),))
    placed = {c: named.get(c, rest) for c in COMPONENTS}
    if "reference" not in named:
        # Not named: with the trainer, whose GPU it shares (`launch/devices.py`).
        placed["reference"] = placed["trainer"]
    return placed


def plan_placement(placement: PlacementConfig, demands: Mapping[str, Demand]) -> PlacementPlan:
    """Checks `placement` against what the run starts (`demands`, one per component of
    `COMPONENTS`) and returns the plan; raises `PlacementError` naming the key first."""
    p = placement
    counts = {
        "call_timeout_s": p.call_timeout_s,
        "slurm.gpus_per_node": p.slurm.gpus_per_node,
        "slurm.cpus_per_task": p.slurm.cpus_per_task,
        "slurm.start_timeout_s": p.slurm.start_timeout_s,
        "kubernetes.gpus_per_pod": p.kubernetes.gpus_per_pod,
        "kubernetes.ready_timeout_s": p.kubernetes.ready_timeout_s,
    }
    for key, value in counts.items():
        if not 0 <= value < float("inf"):  # NaN too
            raise PlacementError(f"placement.{key} must be >= 0 and finite (0: none), got {value}")
    if not 0 < p.spawn_timeout_s < float("inf"):
        raise PlacementError(
            f"placement.spawn_timeout_s must be > 0 and finite, got {p.spawn_timeout_s}"
        )
    if p.split_machines and p.launcher != "process":
        raise PlacementError(
            "placement.split_machines is for launcher process (local hosts of one machine); "
            f"the hosts of launcher {p.launcher} are what they are"
        )
    meshes = parse_hosts(p.hosts, p.launcher)
    placed = parse_components(p.components, meshes)
    if p.launcher == "local":
        for name, count in meshes.items():
            if count != 1:
                raise PlacementError(
                    f"placement.hosts gives {name!r} {count} hosts, but launcher local has "
                    "one host, this one (--placement.launcher process tries several hosts "
                    "on this machine)"
                )
    started = {c: placed[c] for c in COMPONENTS if demands[c].count > 0}
    for component, names in started.items():
        if len(names) > 1 and component not in SERVICES:
            raise PlacementError(
                f"placement.components: {component} runs on one host mesh (services may "
                f"span several: {', '.join(sorted(SERVICES))}), got {'+'.join(names)}"
            )
    unused = [m for m in meshes if not any(m in names for names in started.values())]
    if unused:
        raise PlacementError(
            f"placement.hosts: host mesh {unused[0]!r} runs nothing (no started component is "
            "placed on it by placement.components)"
        )
    gpus = {"slurm": p.slurm.gpus_per_node, "kubernetes": p.kubernetes.gpus_per_pod}.get(
        p.launcher, 0
    )
    _check_trainer(demands["trainer"].count, started["trainer"][0], meshes, gpus)
    timeout = p.call_timeout_s if p.launcher != "local" and p.call_timeout_s > 0 else None
    return PlacementPlan(
        launcher=p.launcher,
        meshes=meshes,
        components=started,
        demands={c: demands[c] for c in started},
        split_machines=p.split_machines,
        call_timeout_s=timeout,
        gpus_per_host=gpus,
        spawn_timeout_s=p.spawn_timeout_s,
    )


def _check_trainer(procs: int, mesh: str, meshes: Mapping[str, int], gpus: int) -> None:
    """The trainer is one Monarch process mesh over every host of its host mesh, which puts
    as many processes on each host; a rank takes the GPU of its local rank."""
    hosts = meshes[mesh]
    if procs % hosts:
        raise PlacementError(
            f"trainer.procs ({procs}) must be a multiple of the {hosts} hosts of host mesh "
            f"{mesh!r} (the trainer's): a process mesh has as many processes on every host"
        )
    if gpus and procs // hosts > gpus:
        raise PlacementError(
            f"trainer.procs ({procs}) over the {hosts} hosts of host mesh {mesh!r} asks "
            f"{procs // hosts} processes of each host, which has {gpus} GPUs"
        )


def describe(plan: PlacementPlan) -> list[str]:
    """One line for the launcher, then one per host mesh: what runs on each of its hosts."""
    what: dict[tuple[str, int], list[str]] = {h: [] for h in _all_hosts(plan)}
    for component, demand in plan.demands.items():
        hosts = plan.hosts_of(component)
        if component == "trainer":
            per_host = plan.trainer_per_host(demand.count)
            for h in hosts:
                what[h].append(f"trainer x{per_host}" if per_host > 1 else "trainer")
        elif component in SERVICES:
            each = " each" if demand.services > 1 else ""
            for i, h in enumerate(hosts):
                replicas = [r for r in range(demand.count) if r % len(hosts) == i]
                label = "replica" if len(replicas) == 1 else "replicas"
                listed = ", ".join(map(str, replicas))
                what[h].append(
                    f"{component} {label} {listed}{each}"
                    if replicas
                    else f"(spare for {component})"
                )
        else:
            what[hosts[0]].append(component)
    machines = ", each host mesh a machine of its own" if plan.split_machines else ""
    timeout = f", call timeout {plan.call_timeout_s:g} s" if plan.call_timeout_s else ""
    lines = [f"placement: launcher {plan.launcher}{machines}{timeout}"]
    for (mesh, i), names in what.items():
        lines.append(f"    {mesh}[{i}]: {', '.join(names) if names else '-'}")
    return lines


_UNMOVABLE = {
    "trainer": "the trainer",
    "replay_buffer": "the replay buffer",
    "dataset": "the dataset",
    "reference": "the reference model",
}
"""Actor names (as `launch/spawn.py` spawns them) of the components with one process each."""


def process_lost(message: str) -> str:
    """One line for Monarch's `SupervisionError` (its `message`): which component's process
    is gone, and that it cannot move. Only service replicas restart (on another host when
    theirs is gone); the other components and the controller hold state nothing restores."""
    named = re.search(r"<[\w.]+ (\w+)\{", message)
    who = _UNMOVABLE.get(named.group(1), "a component") if named else "a component"
    status = message.partition("has status:")[2].strip().splitlines()
    cause = status[0].strip() if status else message.strip().splitlines()[0]
    return (
        f"{who}'s process is gone ({cause}: killed, or its host died); only generator and "
        "reward replicas move to another host during a run. Run the same command with "
        "--resume to continue from the run's newest checkpoint"
    )


def _all_hosts(plan: PlacementPlan) -> list[tuple[str, int]]:
    return [(m, i) for m, n in plan.meshes.items() for i in range(n)]
