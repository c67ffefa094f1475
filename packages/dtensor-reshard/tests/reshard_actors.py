"""Test actors holding real DTensors over gloo. Pickled by value: the spawned processes
cannot import this directory, so cloudpickle ships the module itself."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import cloudpickle  # type: ignore[import-untyped]
import torch
import torch.distributed as dist
from dtensor_reshard import (
    Layout,
    Placement,
    PlanCache,
    PlanPublisher,
    PullStats,
    ReshardPlan,
    ShardedManifest,
    ShardedPublisher,
    ShardedPullResult,
    ShardManifest,
    SourceExport,
    pull,
    pull_plan,
)
from monarch.actor import Actor, endpoint
from rdma_tensor import Transport
from rdma_tensor.machine import this_machine
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SENTINEL = -7.0  # what destination shards hold before a transfer


@dataclass(frozen=True)
class Spec:
    """One DTensor to build: `full(seed)` of `shape`/`dtype`, laid out by `placements`."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    mesh_shape: tuple[int, ...]
    placements: tuple[Placement, ...]
    seed: int = 0


def full(spec: Spec) -> torch.Tensor:
    """The global tensor a spec describes (the same in every process)."""
    g = torch.Generator().manual_seed(spec.seed)
    if spec.dtype.is_floating_point:
        return torch.randn(spec.shape, generator=g).to(spec.dtype)
    return torch.randint(-1000, 1000, spec.shape, generator=g).to(spec.dtype)


def tiny_transformer(seed: int) -> nn.Module:
    """A two-block transformer language model (embedding, attention + MLP blocks, head)."""
    torch.manual_seed(seed)
    width, vocab = 24, 50
    return nn.Sequential(
        nn.Embedding(vocab, width),
        nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=40, batch_first=True),
        nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=40, batch_first=True),
        nn.LayerNorm(width),
        nn.Linear(width, vocab),
    )


class DTensorWorker(Actor):
    """One process of a mesh: a gloo process group, DTensors per role ("src"/"dst"), and the
    package's two sides of a transfer (publisher and puller) with a plan cache."""

    def __init__(self) -> None:
        self.tensors: dict[str, dict[str, DTensor]] = {"src": {}, "dst": {}}
        self.cache = PlanCache()
        self.publisher: PlanPublisher | None = None
        self.mode: tuple[bool, Transport | None] = (False, None)

    @endpoint
    async def init_gloo(self) -> None:
        if not dist.is_initialized():
            dist.init_process_group("gloo")

    def _mesh(self, mesh_shape: tuple[int, ...]) -> DeviceMesh:
        n = dist.get_world_size()
        return DeviceMesh("cpu", torch.arange(n).reshape(mesh_shape))

    def _rank(self, role: str) -> int:
        tensor = next(iter(self.tensors[role].values()))
        coordinate = tensor.device_mesh.get_coordinate()
        assert coordinate is not None
        return Layout.from_dtensor(tensor).rank_of(coordinate)

    @endpoint
    async def build(self, role: str, specs: dict[str, Spec]) -> dict[str, Layout]:
        """Creates this role's DTensors: sources hold data, destinations a sentinel."""
        built = {}
        for name, spec in specs.items():
            data = full(spec) if role == "src" else torch.full(spec.shape, SENTINEL).to(spec.dtype)
            built[name] = distribute_tensor(data, self._mesh(spec.mesh_shape), spec.placements)
        self.tensors[role] = built
        return {name: Layout.from_dtensor(t) for name, t in built.items()}

    @endpoint
    async def build_model(
        self,
        role: str,
        seed: int,
        mesh_shape: tuple[int, ...],
        placements: dict[str, tuple[Placement, ...]],
    ) -> dict[str, Layout]:
        """The tiny transformer's state dict, each tensor distributed by `placements`."""
        state = tiny_transformer(seed).state_dict()
        mesh = self._mesh(mesh_shape)
        self.tensors[role] = {
            name: distribute_tensor(t, mesh, placements[name]) for name, t in state.items()
        }
        return {name: Layout.from_dtensor(t) for name, t in self.tensors[role].items()}

    @endpoint
    async def publish(
        self,
        src: dict[str, Layout],
        dst: dict[str, Layout],
        colocated: bool = False,
        staged: bool = False,
        transport: Transport | None = None,
    ) -> SourceExport:
        plan = self.cache.get(src, dst, colocated=colocated)
        if self.publisher is None or self.mode != (staged, transport):
            if self.publisher is not None:
                self.publisher.close()
            self.publisher = PlanPublisher(self._rank("src"), staged=staged, transport=transport)
            self.mode = (staged, transport)
        return self.publisher.publish(plan, self.tensors["src"])

    @endpoint
    async def pull(
        self,
        src: dict[str, Layout],
        dst: dict[str, Layout],
        exports: list[SourceExport],
        colocated: bool = False,
    ) -> PullStats:
        plan = self.cache.get(src, dst, colocated=colocated)
        return await pull_plan(plan, self._rank("dst"), exports, self.tensors["dst"])

    @endpoint
    async def release(self) -> None:
        if self.publisher is not None:
            self.publisher.release()

    @endpoint
    async def full_tensors(self, role: str) -> dict[str, torch.Tensor]:
        """Every tensor's `full_tensor()` (a collective: call it on the whole mesh)."""
        return {name: t.full_tensor() for name, t in self.tensors[role].items()}

    @endpoint
    async def plans_computed(self) -> int:
        return self.cache.computed


class PlainSource(Actor):
    """A source rank holding plain local shards (no process group), for fault tests. Each
    `publish` uses a publisher of its own, so direct and staged exports can coexist."""

    def __init__(self) -> None:
        self.publishers: list[PlanPublisher] = []

    @endpoint
    async def publish(
        self, plan: ReshardPlan, rank: int, shards: dict[str, torch.Tensor], staged: bool
    ) -> SourceExport:
        self.publishers.append(PlanPublisher(rank, staged=staged))
        return self.publishers[-1].publish(plan, shards)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def version_weights(seed: int) -> dict[str, torch.Tensor]:
    """The tiny transformer's weights for one version (the same in every process)."""
    return {n: t.clone() for n, t in tiny_transformer(seed).state_dict().items()}


class ShardedTrainerRank(Actor):
    """One rank of a sharded "trainer": the tiny transformer's weights as `Shard(0)` DTensors
    over its gloo world (uneven shards included), published with a `ShardedPublisher`."""

    def __init__(self) -> None:
        self.params: dict[str, DTensor] = {}
        self.publisher: ShardedPublisher | None = None

    @endpoint
    async def setup(self, destination: dict[str, Layout] | None = None) -> None:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        mesh = DeviceMesh("cpu", torch.arange(dist.get_world_size()))
        weights = version_weights(0)
        self.params = {n: distribute_tensor(t, mesh, [Shard(0)]) for n, t in weights.items()}
        self.publisher = ShardedPublisher(dist.get_rank(), destination=destination)

    @endpoint
    async def step(self, seed: int) -> None:
        """An "optimizer step": every local shard takes the weights of `seed`, in place."""
        for name, full in version_weights(seed).items():
            param = self.params[name]
            layout = Layout.from_dtensor(param)
            rank = layout.rank_of(tuple(param.device_mesh.get_coordinate() or ()))
            param.to_local().copy_(layout.local_shard(rank, full))

    @endpoint
    async def publish(self, version: int) -> ShardManifest:
        assert self.publisher is not None
        return self.publisher.publish(self.params, version)

    @endpoint
    async def release(self, version: int) -> None:
        assert self.publisher is not None
        self.publisher.release(version)

    @endpoint
    async def publish_error(self, case: str) -> str:
        """Tries one bad publish; returns "ErrorType: message" ("" if it was accepted)."""
        assert self.publisher is not None
        args: dict[str, tuple[object, object]] = {
            "stale": (self.params, 0),
            "negative": (self.params, -1),
            "plain": ({**self.params, "extra": torch.zeros(2)}, 99),
            "empty": ({}, 99),
            "wrong_rank": (self.params, 99),
            "closed": (self.params, 99),
        }
        publisher = self.publisher
        if case == "wrong_rank":
            publisher = ShardedPublisher(dist.get_rank() + 1)
        elif case == "closed":
            publisher = ShardedPublisher(dist.get_rank())
            publisher.close()
        state, version = args[case]
        try:
            publisher.publish(state, version)  # type: ignore[arg-type]
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return ""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class UnshardedGenerator(Actor):
    """A "generator" holding the whole tiny transformer (no process group), pulling versions
    through `dtensor_reshard.pull`."""

    def __init__(self) -> None:
        self.model = tiny_transformer(99)

    @endpoint
    async def update(self, manifest: ShardedManifest) -> tuple[int, int]:
        result = await pull(manifest, into=dict(self.model.state_dict()))
        return result.version, result.bytes_read

    @endpoint
    async def update_result(self, manifest: ShardedManifest) -> ShardedPullResult:
        return await pull(manifest, into=dict(self.model.state_dict()))

    @endpoint
    async def machine_id(self) -> str:
        """The machine id this process declared (`RDMA_TENSOR_MACHINE_ID`), "" if none."""
        return this_machine().machine_id

    @endpoint
    async def weights(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self.model.state_dict().items()}


@dataclass(frozen=True)
class PlanPullOutcome:
    """A `pull_plan` as the controller sees it: the destination shard and stats, or the
    error's type and message (then `shard` is the destination as the failed pull left it)."""

    shard: torch.Tensor
    stats: PullStats | None
    error: str


class PlanPuller(Actor):
    """A destination rank holding one plain local shard (no process group)."""

    @endpoint
    async def pull(
        self, plan: ReshardPlan, dst_rank: int, exports: list[SourceExport], name: str
    ) -> PlanPullOutcome:
        shard = torch.full(plan.local_shapes(dst_rank, "destination")[name], SENTINEL)
        try:
            stats = await pull_plan(plan, dst_rank, exports, {name: shard})
        except Exception as e:
            return PlanPullOutcome(shard, None, f"{type(e).__name__}: {e}")
        return PlanPullOutcome(shard, stats, "")
