"""Placement without spawning anything: the plan of a good placement, one clear error for
each bad one (on the command line: exit status 2, nothing written), the launchers' tool and
credential checks, and the SLURM and Kubernetes settings built from the config.

No test here has a cluster: the SLURM batch script is Monarch's own, produced by
`SlurmJob` through a stand-in `sbatch` that records it (`test_the_slurm_batch_script`); a
real SLURM or Kubernetes cluster has never run this app.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from async_grpo.cli.main import main
from async_grpo.cli.training import run_failure
from async_grpo.config.placement import PlacementConfig, SlurmConfig, three_local_hosts
from async_grpo.launch.launchers import (
    KubernetesMesh,
    check_launcher,
    kubeconfig_file,
    kubernetes_meshes,
    slurm_job_args,
)
from async_grpo.launch.placement import (
    Demand,
    PlacementError,
    PlacementPlan,
    describe,
    plan_placement,
    process_lost,
)
from jobs import refuse_spawn
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from placements import RUN, SLURM


def plan(trainer_procs: int = 1, **fields: object) -> PlacementPlan:
    demands = {**RUN, "trainer": Demand(trainer_procs)}
    for key in ("generator", "reward", "env", "reference"):
        if key in fields:
            demands[key] = Demand(int(str(fields.pop(key))))
    return plan_placement(PlacementConfig(**fields), demands)  # type: ignore[arg-type]


def test_the_default_is_everything_on_this_host() -> None:
    p = plan()
    assert p.launcher == "local"
    assert dict(p.meshes) == {"main": 1}
    assert set(p.components) == {"trainer", "generator", "reward", "buffer", "dataset"}
    assert set(p.components.values()) == {("main",)}
    assert p.call_timeout_s is None  # a host cannot die alone under the controller


def test_three_local_hosts() -> None:
    p = plan_placement(three_local_hosts(), RUN)
    assert dict(p.components) == {
        "trainer": ("a",),
        "generator": ("b",),
        "reward": ("c",),
        "buffer": ("c",),
        "dataset": ("c",),
    }
    assert p.split_machines
    assert p.call_timeout_s == 300.0
    assert describe(p) == [
        "placement: launcher process, each host mesh a machine of its own, call timeout 300 s",
        "    a[0]: trainer",
        "    b[0]: generator replica 0",
        "    c[0]: reward replica 0, buffer, dataset",
    ]


def test_services_spread_over_every_host_of_their_meshes() -> None:
    p = plan(
        trainer_procs=4,
        generator=3,
        reward=1,
        launcher="process",
        hosts="t=2,g=1,h=2",
        components="trainer=t,generator=g+h,reward=h,*=t",
        call_timeout_s=0,
    )
    assert p.hosts_of("generator") == [("g", 0), ("h", 0), ("h", 1)]
    assert p.call_timeout_s is None  # 0: none
    assert describe(p)[1:] == [
        "    t[0]: trainer x2, buffer, dataset",
        "    t[1]: trainer x2",
        "    g[0]: generator replica 0",
        "    h[0]: generator replica 1, reward replica 0",
        "    h[1]: generator replica 2, (spare for reward)",
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"components": "trainr=main"}, "unknown component 'trainr' (did you mean 'trainer'?)"),
        ({"components": "trainer=gpu"}, "names host mesh 'gpu', which placement.hosts does not"),
        ({"components": "trainer"}, "'trainer' is not COMPONENT=MESH"),
        ({"components": "buffer=main,buffer=main"}, "'buffer' is placed twice"),
        ({"hosts": "a"}, "placement.hosts: 'a' is not NAME=COUNT"),
        ({"hosts": "a=two"}, "placement.hosts: 'a=two' is not NAME=COUNT"),
        ({"hosts": "a=0"}, "host mesh 'a' needs at least 1 host"),
        ({"hosts": "a=1,a=1"}, "host mesh 'a' is given twice"),
        ({"hosts": "2nd=1"}, "mesh name '2nd' must be a letter"),
        ({"hosts": "a=1,b=2"}, "launcher local has one host, this one"),
        (
            {"launcher": "process", "hosts": "a=1,b=1", "components": "trainer=a+b"},
            "trainer runs on one host mesh",
        ),
        (
            {"launcher": "process", "hosts": "a=1,b=1", "components": "buffer=a+b,*=a"},
            "buffer runs on one host mesh",
        ),
        (
            {"launcher": "process", "hosts": "a=1,b=1,c=1", "components": "generator=b,*=a"},
            "host mesh 'c' runs nothing",
        ),
        (
            {"launcher": "process", "hosts": "a=2", "trainer_procs": 3},
            "trainer.procs (3) must be a multiple of the 2 hosts of host mesh 'a'",
        ),
        (
            {
                "launcher": "slurm",
                "hosts": "a=1",
                "trainer_procs": 16,
                "slurm": SlurmConfig(gpus_per_node=8),
            },
            "asks 16 processes of each host, which has 8 GPUs",
        ),
        ({"launcher": "kubernetes", "hosts": "gen_a=1"}, "on Kubernetes a mesh names its pods"),
        ({"launcher": "slurm", "split_machines": True}, "split_machines is for launcher process"),
        ({"call_timeout_s": -1.0}, "placement.call_timeout_s must be >= 0 and finite"),
        ({"spawn_timeout_s": 0.0}, "placement.spawn_timeout_s must be > 0 and finite, got 0.0"),
        (
            {"slurm": SlurmConfig(gpus_per_node=-8)},
            "placement.slurm.gpus_per_node must be >= 0 and finite",
        ),
    ],
)
def test_bad_placements_are_one_clear_error(fields: dict[str, object], message: str) -> None:
    procs = int(str(fields.pop("trainer_procs", 1)))
    with pytest.raises(PlacementError) as e:
        plan(trainer_procs=procs, **fields)
    assert message in str(e.value)


def test_a_component_the_run_does_not_start_may_be_placed_anywhere() -> None:
    # The reference only runs with the KL term on; its placement still names a real mesh.
    p = plan(launcher="process", hosts="a=1,b=1", components="reference=b,generator=b,*=a")
    assert "reference" not in p.components
    with pytest.raises(PlacementError, match="'reference=b' names host mesh 'b'"):
        plan(components="reference=b")


def run_main(args: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    assert main(["--preset", "tiny", *args, "--out_dir", str(out)], spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo: error: "), err
    assert err.count("\n") == 1, err
    assert not out.exists()  # refused before anything was written
    return err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--placement.components", "trainer=gpu"], "names host mesh 'gpu'"),
        (["--placement.components", "critic=main"], "unknown component 'critic'"),
        (["--placement.launcher", "mars"], "placement.launcher: 'mars' is not one of"),
        (
            ["--placement.launcher", "process", "--placement.hosts", "a=3", "--trainer.procs", "2"],
            "trainer.procs (2) must be a multiple of the 3 hosts",
        ),
    ],
)
def test_bad_placement_on_the_command_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in run_main(args, capsys, tmp_path / "out")


def test_slurm_without_its_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    err = run_main(["--placement.launcher", "slurm"], capsys, tmp_path / "out")
    assert "needs SLURM's sbatch, squeue, scancel on PATH (not found: sbatch, squeue" in err


def test_kubernetes_without_its_package_or_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import fails, installed or not
    err = run_main(["--placement.launcher", "kubernetes"], capsys, tmp_path / "out")
    assert "needs the `kubernetes` Python package" in err

    monkeypatch.setitem(sys.modules, "kubernetes", types.ModuleType("kubernetes"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    err = run_main(["--placement.launcher", "kubernetes"], capsys, tmp_path / "out")
    assert "no Kubernetes credentials" in err
    missing = tmp_path / "nope.yaml"
    args = ["--placement.launcher", "kubernetes", "--placement.kubernetes.kubeconfig", str(missing)]
    assert f"kubeconfig: {missing} is not a file" in run_main(args, capsys, tmp_path / "out")


def test_kubeconfig_is_found_where_kubectl_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    home = tmp_path / ".kube" / "config"
    home.parent.mkdir()
    home.write_text("apiVersion: v1\n")
    listed = tmp_path / "cluster.yaml"
    listed.write_text("apiVersion: v1\n")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'gone.yaml'}{os.pathsep}{listed}")
    assert kubeconfig_file("") == listed
    monkeypatch.delenv("KUBECONFIG")
    assert kubeconfig_file("") == home
    assert kubeconfig_file(str(listed)) == listed
    monkeypatch.setitem(sys.modules, "kubernetes", types.ModuleType("kubernetes"))
    check_launcher(PlacementConfig(launcher="kubernetes"))  # credentials and package: passes


def test_kubernetes_meshes() -> None:
    config = PlacementConfig(launcher="kubernetes", hosts="trainer=2,gen=4")
    config.kubernetes.image = "registry.example/async-grpo:1"
    config.kubernetes.gpus_per_pod = 8
    config.components = "trainer=trainer,*=gen"
    p = plan_placement(config, {**RUN, "trainer": Demand(16)})
    assert kubernetes_meshes(p, config) == [
        KubernetesMesh("trainer", 2, "registry.example/async-grpo:1", 8),
        KubernetesMesh("gen", 4, "registry.example/async-grpo:1", 8),
    ]


def test_slurm_job_arguments(tmp_path: Path) -> None:
    p = plan_placement(SLURM, {**RUN, "trainer": Demand(16)})
    assert slurm_job_args(p, SLURM, str(tmp_path)) == {
        "meshes": {"trainer": 2, "gen": 1},
        "python_exe": "/shared/venv/bin/python",
        "slurm_args": ["--constraint=ib", "--nice=10"],
        "job_name": "async_grpo",
        "log_dir": str(tmp_path / "slurm"),
        "exclusive": True,
        "partition": "h100",
        "time_limit": "02:00:00",
        "gpus_per_node": 8,
    }


@pytest.mark.slow  # a job script run by bash, processes
def test_the_slurm_batch_script(tmp_path: Path) -> None:
    """Monarch's `SlurmJob` writes the batch script from our arguments and hands it to
    `sbatch`; here `sbatch` and `scancel` are stand-ins that record what they got. In a
    subprocess: building a `SlurmJob` switches Monarch's transport for the whole process."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sbatch").write_text(
        f'#!/bin/sh\ncat > {tmp_path}/script\necho "Submitted batch job 4242"\n'
    )
    (tools / "scancel").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/cancelled\n')
    for tool in ("sbatch", "scancel"):
        (tools / tool).chmod(0o755)
    code = (
        "import sys\n"
        "from monarch.job import SlurmJob\n"
        "from async_grpo.launch.launchers import slurm_job_args\n"
        "from async_grpo.launch.placement import Demand, plan_placement\n"
        "from placements import RUN, SLURM\n"
        "plan = plan_placement(SLURM, {**RUN, 'trainer': Demand(16)})\n"
        "job = SlurmJob(**slurm_job_args(plan, SLURM, sys.argv[1]))\n"
        "job.apply()\n"
        "job.kill()\n"
    )
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    helpers = os.path.dirname(os.path.dirname(__file__))  # `placements`, beside `jobs`
    env["PYTHONPATH"] = os.pathsep.join([helpers, env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, check=True, timeout=120)
    script = (tmp_path / "script").read_text().splitlines()
    for directive in [
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=h100",
        "#SBATCH --time=02:00:00",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=ib",
        "#SBATCH --nice=10",
    ]:
        assert directive in script, (directive, script)
    assert any(line.startswith(f"#SBATCH --output={tmp_path}/slurm/") for line in script)
    (worker,) = [line for line in script if line.startswith("srun ")]
    assert worker.startswith("srun /shared/venv/bin/python -c ")
    assert "run_worker_loop_forever" in worker
    assert (tmp_path / "cancelled").read_text().split() == ["4242"]  # the job is cancelled


# What a run printed when host a (the trainer's) was SIGKILLed (Monarch's SupervisionError).
TRAINER_GONE = (
    "Endpoint call trainer.publish_initial() failed, Supervision event: actor <root>.<async_grpo"
    ".actors.trainer.Trainer trainer{'hosts': 0/1, 'procs': 0/1}> has status:\n"
    "  stopped: no status received from process"
)


def test_a_lost_process_that_cannot_move_is_one_line() -> None:
    line = run_failure(SupervisionError(TRAINER_GONE))
    assert line.startswith(
        "the trainer's process is gone (stopped: no status received from process: killed, "
        "or its host died); only generator and reward replicas move to another host during a "
        "run. Run the same command with --resume to continue from the run's newest checkpoint"
    ), line
    buffer = TRAINER_GONE.replace("trainer.Trainer trainer{", "buffer.BufferActor replay_buffer{")
    assert process_lost(buffer).startswith("the replay buffer's process is gone")
    assert process_lost("lost").startswith("a component's process is gone (lost")
