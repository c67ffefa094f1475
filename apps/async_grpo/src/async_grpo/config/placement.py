"""Where a run's processes go, as configured (`--placement.*`): host meshes, the launcher
that starts them, SLURM and Kubernetes settings. `launch.placement` checks and plans it."""

from __future__ import annotations

import dataclasses
from typing import Literal

Launcher = Literal["local", "process", "slurm", "kubernetes"]


@dataclasses.dataclass
class SlurmConfig:
    """`--placement.launcher slurm`: one SLURM job (`sbatch`) with a node per host, every
    host mesh a group of its nodes; Monarch's `SlurmJob` submits it and connects to the
    workers it starts. The controller runs where `sbatch` and `squeue` work (a login
    node); `out_dir`, the checkpoint and the Python environment must be at the same path
    on every node (a shared filesystem)."""

    partition: str = ""
    """Partition to submit to (`#SBATCH --partition`); empty: the cluster's default."""
    time_limit: str = ""
    """Wall-clock limit of the job, HH:MM:SS (`#SBATCH --time`); empty: the partition's."""
    account: str = ""
    """Account charged (`#SBATCH --account`); empty: your default."""
    qos: str = ""
    """Quality of service (`#SBATCH --qos`); empty: the default."""
    gpus_per_node: int = 0
    """GPUs requested per node (`#SBATCH --gpus-per-node`); 0: none."""
    cpus_per_task: int = 0
    """CPUs per node's worker task (`#SBATCH --cpus-per-task`); 0: SLURM's default."""
    mem: str = ""
    """Memory per node, e.g. 200G (`#SBATCH --mem`); empty: SLURM's default."""
    exclusive: bool = True
    """Whole nodes (`#SBATCH --exclusive`)."""
    python: str = ""
    """Python that starts the Monarch worker on each node; empty: this controller's own
    interpreter, which must then exist at the same path on the nodes."""
    sbatch_args: str = ""
    """More sbatch options, each an `#SBATCH` line, e.g. "--constraint=h100 --nice=10"."""
    start_timeout_s: int = 0
    """Give up when the job has not started after this many seconds; 0: wait in the queue."""


@dataclasses.dataclass
class KubernetesConfig:
    """`--placement.launcher kubernetes`: every host mesh a set of pods running Monarch's
    worker, one pod per host, through Monarch's `KubernetesJob` (needs the `kubernetes`
    Python package and credentials). With `image` set, Monarch's operator provisions one
    `MonarchMesh` per host mesh; without, it attaches to worker pods already running,
    labelled `monarch.pytorch.org/mesh-name=<mesh>`. `out_dir` and the checkpoint must be
    at the same path in every pod (a shared volume)."""

    namespace: str = "default"
    """Namespace of the worker pods."""
    image: str = ""
    """Container image of the worker pods to provision (it must hold this app); empty:
    attach to worker pods already running."""
    kubeconfig: str = ""
    """kubeconfig file, for a controller outside the cluster; empty: $KUBECONFIG, else
    ~/.kube/config, else the pod's own service account (a controller inside the cluster)."""
    gpus_per_pod: int = 0
    """GPUs of each pod: requested by provisioned pods (`nvidia.com/gpu`), and the most
    trainer ranks a pod takes; 0: none."""
    ready_timeout_s: int = 0
    """Give up when a host mesh's pods are not ready after this many seconds; 0: wait."""


@dataclasses.dataclass
class PlacementConfig:
    """Which host mesh each component runs on, and what starts the hosts."""

    launcher: Launcher = "local"
    """What starts the hosts: local (this host, for every mesh name), process (a local
    subprocess per host, for tests and trying), slurm, kubernetes."""
    hosts: str = "main=1"
    """Host meshes and their host counts, e.g. "trainer=1,gen=2,rest=1" (letters, digits, _)."""
    components: str = ""
    """Component -> host mesh, e.g. "trainer=a,generator=b+c,*=c": a service (generator,
    reward, env) may name several (+); `*` places every component not named; empty:
    everything on the first host mesh. Components: trainer, generator, reward, env,
    buffer, dataset, reference."""
    split_machines: bool = False
    """launcher process: each host mesh's processes declare a machine of their own
    (`RDMA_TENSOR_MACHINE_ID` = the mesh name), so weights cross between meshes by RDMA as
    between computers; false: one machine, shared memory."""
    call_timeout_s: float = 300.0
    """Launchers other than local: a generator, reward or environment call unanswered
    this long marks its replica hung (restarted, the call re-sent): how the replicas of a
    dead host are found. Set it above the slowest generate or weight load; 0: never."""
    spawn_timeout_s: float = 30.0
    """A replica whose processes have not started on a host after this long marks that host
    down, and the next host the service may use is tried: after a host dies, the wait before
    its replicas start elsewhere. Set it above the slowest process start on a live host."""
    slurm: SlurmConfig = dataclasses.field(default_factory=SlurmConfig)
    """SLURM job settings (launcher slurm)."""
    kubernetes: KubernetesConfig = dataclasses.field(default_factory=KubernetesConfig)
    """Kubernetes settings (launcher kubernetes)."""


def three_local_hosts() -> PlacementConfig:
    """The trainer on one local host, the generators on a second, everything else on a
    third, each host mesh declaring a machine of its own so that weights cross between
    them by RDMA: several hosts on one computer, as the tests and the benchmark run them."""
    return PlacementConfig(
        launcher="process",
        hosts="a=1,b=1,c=1",
        components="trainer=a,generator=b,*=c",
        split_machines=True,
    )
