"""Starting the host meshes of a placement (`placement.PlacementPlan`) with Monarch's job
launchers, and handing each component its hosts.

- `local`: every host mesh is this host (`this_host()`, what Monarch's `LocalJob` returns),
  exactly as a run without placement;
- `process`: a `monarch.job.ProcessJob` per host mesh, each host a local subprocess running
  Monarch's worker loop. One job per mesh, so that with `split_machines` each mesh's
  processes can declare a machine of their own (`rdma_tensor.machine.machine_env`, set in
  its workers' environment, which every process spawned there inherits);
- `slurm`: one `monarch.job.SlurmJob` with every mesh (one node per host);
- `kubernetes`: one `monarch.job.kubernetes.KubernetesJob`, a Monarch mesh per host mesh.

`check_launcher` looks for each launcher's tools and credentials in the controller before
anything is spawned (`prepare` calls it); `slurm_job_args` and `kubernetes_meshes` are the
launchers' settings as plain values, built and checked without a cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monarch.actor import HostMesh, this_host
from rdma_tensor.machine import machine_env

from async_grpo.config.placement import PlacementConfig
from async_grpo.launch.placement import PlacementError, PlacementPlan

SLURM_TOOLS = ("sbatch", "squeue", "scancel")
"""What Monarch's SlurmJob runs: submit, wait for the nodes, cancel at the end."""

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def check_launcher(placement: PlacementConfig) -> None:
    """Raises `PlacementError` when the launcher cannot start here: a missing tool, Python
    package or credential, named with how to get it."""
    if placement.launcher == "slurm":
        missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
        if missing:
            raise PlacementError(
                f"placement.launcher slurm needs SLURM's {', '.join(SLURM_TOOLS)} on PATH "
                f"(not found: {', '.join(missing)}); run the controller on a login node"
            )
    elif placement.launcher == "kubernetes":
        try:
            importlib.import_module("kubernetes")
        except ImportError:
            raise PlacementError(
                "placement.launcher kubernetes needs the `kubernetes` Python package "
                "(Monarch's KubernetesJob uses it): uv run --with kubernetes async-grpo ..."
            ) from None
        kubeconfig_file(placement.kubernetes.kubeconfig)


def kubeconfig_file(given: str) -> Path | None:
    """The kubeconfig file to use: `given`, else $KUBECONFIG, else ~/.kube/config; None
    inside a cluster (a service account token and `KUBERNETES_SERVICE_HOST`). Raises
    `PlacementError` when there are no credentials at all, or `given` does not exist."""
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise PlacementError(f"placement.kubernetes.kubeconfig: {given} is not a file")
        return path
    env = os.environ.get("KUBECONFIG", "")
    # $KUBECONFIG may list several files; Monarch's KubeConfig takes one.
    for candidate in [*env.split(os.pathsep), "~/.kube/config"]:
        if candidate and Path(candidate).expanduser().is_file():
            return Path(candidate).expanduser()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).is_file():
        return None
    raise PlacementError(
        "placement.launcher kubernetes: no Kubernetes credentials (no "
        "--placement.kubernetes.kubeconfig, no $KUBECONFIG file, no ~/.kube/config, and "
        f"not inside a cluster: no {SERVICE_ACCOUNT_TOKEN})"
    )


def slurm_job_args(plan: PlacementPlan, placement: PlacementConfig, out_dir: str) -> dict[str, Any]:
    """The keyword arguments of `monarch.job.SlurmJob` for this plan: a node per host."""
    s = placement.slurm
    optional = {
        "partition": s.partition or None,
        "time_limit": s.time_limit or None,
        "account": s.account or None,
        "qos": s.qos or None,
        "gpus_per_node": s.gpus_per_node or None,
        "cpus_per_task": s.cpus_per_task or None,
        "mem": s.mem or None,
        "job_start_timeout": s.start_timeout_s or None,
    }
    return {
        "meshes": dict(plan.meshes),
        "python_exe": s.python or sys.executable,
        "slurm_args": shlex.split(s.sbatch_args),
        "job_name": "async_grpo",
        "log_dir": str(Path(out_dir, "slurm").resolve()),
        "exclusive": s.exclusive,
        **{k: v for k, v in optional.items() if v is not None},
    }


@dataclasses.dataclass(frozen=True)
class KubernetesMesh:
    """One `KubernetesJob.add_mesh`: `hosts` pods of `image` (empty: attach to running
    ones) requesting `gpus` GPUs each."""

    name: str
    hosts: int
    image: str
    gpus: int


def kubernetes_meshes(plan: PlacementPlan, placement: PlacementConfig) -> list[KubernetesMesh]:
    """The `add_mesh` calls of the Kubernetes job: a pod per host of each host mesh."""
    k = placement.kubernetes
    return [KubernetesMesh(m, n, k.image, k.gpus_per_pod) for m, n in plan.meshes.items()]


class Hosts:
    """The host meshes of a running placement, by name, handed out per component; `jobs`:
    the Monarch job holding each mesh (none for the local launcher, which started
    nothing); `stop` ends them."""

    def __init__(
        self,
        plan: PlacementPlan,
        meshes: dict[str, HostMesh],
        stop: Callable[[], None],
        jobs: dict[str, Any] | None = None,
    ) -> None:
        self.plan, self.meshes, self._stop = plan, meshes, stop
        self.jobs = jobs or {}

    def mesh(self, component: str) -> HostMesh:
        """The one host mesh of `component` (all of its hosts)."""
        return self.meshes[self.plan.components[component][0]]

    def first_host(self, component: str) -> HostMesh:
        """The first host of `component`'s host mesh: where a one-process component runs."""
        return self.mesh(component).flatten("host").slice(host=0)

    def for_service(self, component: str) -> list[HostMesh] | None:
        """The host meshes a service spreads its replicas over; None on launcher local,
        where every replica runs on this host as without placement."""
        if self.plan.launcher == "local":
            return None
        return [self.meshes[m] for m in self.plan.components[component]]

    def stop(self) -> None:
        """Ends the jobs; every process on their hosts goes with them. Idempotent."""
        stop, self._stop = self._stop, lambda: None
        stop()


def start_hosts(plan: PlacementPlan, placement: PlacementConfig, out_dir: str) -> Hosts:
    """Starts (or, for a scheduler, allocates and connects to) every host mesh of `plan`.
    Blocks until the hosts are up: a SLURM job waits in its queue here."""
    if plan.launcher == "local":
        return Hosts(plan, {m: this_host() for m in plan.meshes}, lambda: None)
    # Monarch's job module logs its progress at INFO to stderr ("No cached path provided").
    logging.getLogger("monarch._src.job.job").setLevel(logging.WARNING)
    if plan.launcher == "process":
        return _process_hosts(plan)
    job: Any
    if plan.launcher == "slurm":
        from monarch.job import SlurmJob  # noqa: PLC0415  (see `_process_hosts`)

        job = SlurmJob(**slurm_job_args(plan, placement, out_dir))
    else:
        job = _kubernetes_job(plan, placement)
    try:
        state = job.state(cached_path=None)
        meshes = {m: getattr(state, m) for m in plan.meshes}
    except BaseException:
        _kill(job)
        raise
    return Hosts(plan, meshes, lambda: _kill(job), dict.fromkeys(meshes, job))


def _process_hosts(plan: PlacementPlan) -> Hosts:
    # Imported only when used: `monarch.job` imports Flask, and a process that has Flask
    # loaded fails to start a vLLM engine (its kernel registration walks every module and
    # trips over Flask's `current_app` proxy). A test module that imports this one is
    # imported by the actor processes that run its own actor classes.
    from monarch.job import ProcessJob  # noqa: PLC0415

    jobs: dict[str, Any] = {}

    def stop() -> None:
        for job in jobs.values():
            _kill(job)

    meshes: dict[str, HostMesh] = {}
    try:
        for name, count in plan.meshes.items():
            env = machine_env(name) if plan.split_machines else None
            jobs[name] = ProcessJob({name: count}, env=env)
            meshes[name] = getattr(jobs[name].state(cached_path=None), name)
    except BaseException:
        stop()
        raise
    return Hosts(plan, meshes, stop, jobs)


def _kubernetes_job(plan: PlacementPlan, placement: PlacementConfig) -> Any:
    """Monarch's KubernetesJob for the plan. Never applied to a cluster (none here); built
    once by hand with the `kubernetes` package installed."""
    from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob  # noqa: PLC0415

    k = placement.kubernetes
    path = kubeconfig_file(k.kubeconfig)
    job = KubernetesJob(
        namespace=k.namespace,
        timeout=k.ready_timeout_s or None,
        kubeconfig=KubeConfig.from_path(str(path)) if path else None,
    )
    for mesh in kubernetes_meshes(plan, placement):
        resources: dict[str, str | int] | None = (
            {"nvidia.com/gpu": mesh.gpus} if mesh.gpus else None
        )
        spec = ImageSpec(mesh.image, resources=resources) if mesh.image else None
        job.add_mesh(mesh.name, mesh.hosts, image_spec=spec)
    return job


def _kill(job: Any) -> None:
    # A Kubernetes job of attach-only meshes cannot be killed (the pods are not ours to
    # delete): NotImplementedError. Nothing else can be done about a failing kill here.
    with contextlib.suppress(Exception):
        job.kill()
