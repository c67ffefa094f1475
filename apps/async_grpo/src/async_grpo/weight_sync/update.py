"""How a new policy version reaches the generators, whatever the trainer's shape.

One vocabulary on both sides: the trainer `publish`es a version (each rank its part), the
controller `merge`s the ranks' parts into the one update every generator receives, and a
generator `pull`s it into its weights, all or nothing. Only the data path differs:

- one trainer process (`trainer.procs == 1`): `rdma_tensor.Publisher` stages the whole state
  dict on CPU; the update is a `Manifest`;
- a sharded trainer (`trainer.procs > 1`, every parameter a `Shard(0)` DTensor):
  `dtensor_reshard.ShardedPublisher` stages each rank's shards; the update is a
  `ShardedManifest`, and a generator (one unsharded copy) pulls exactly its pieces from
  every rank, with no gather on the trainer side;
- LoRA adapters (one trainer process): the base weights never change, so a version is the
  adapter's tensors alone (`model.lora.adapter_state`, peft's names), staged and pulled as
  above into the generator's own adapter.

This module is the one place that knows there are two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import dtensor_reshard
import rdma_tensor
from dtensor_reshard import ShardedManifest, ShardedPublisher, ShardManifest
from rdma_tensor import Manifest, Publisher, Transport
from torch import Tensor
from transformers import PreTrainedModel

from async_grpo.grpo.step import check_finite
from async_grpo.model.lora import adapter_state

if TYPE_CHECKING:
    from peft import PeftModel

WeightPart = Manifest | ShardManifest
"""What one trainer rank returns for a version (the whole of it when there is one rank)."""

WeightUpdate = Manifest | ShardedManifest
"""What every generator receives: one version, from every trainer rank."""


class TrainerPublisher:
    """The trainer's side: stages `model`'s weights as versions for the generators.

    A sharded model (`sharded=True`) publishes its parameters (DTensors); a plain one its
    state dict, or with `adapter` (the `PeftModel` around `model`) the adapter's tensors
    alone. The tensors are the model's own, so each publish stages their current values.
    Non-finite weights are refused before anything is staged.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        rank: int,
        sharded: bool,
        adapter: PeftModel | None = None,
    ) -> None:
        if adapter is not None and sharded:
            raise ValueError("LoRA adapters are published by a one-process trainer only")
        self._state: dict[str, Tensor]
        self._publisher: Publisher | ShardedPublisher
        if sharded:
            self._state = dict(model.named_parameters())
            self._publisher = ShardedPublisher(rank)
        else:
            self._state = adapter_state(adapter) if adapter is not None else model.state_dict()
            self._publisher = Publisher()

    def publish(self, version: int) -> WeightPart:
        check_finite(self._state, version)
        if isinstance(self._publisher, ShardedPublisher):
            return self._publisher.publish(self._state, version)  # type: ignore[arg-type]
        return self._publisher.publish(self._state, version)

    def release(self, version: int) -> None:
        """Every generator runs `version` or newer: staging of older versions may be reused."""
        self._publisher.release(version)


def merge(parts: Sequence[WeightPart | WeightUpdate]) -> WeightUpdate:
    """The ranks' parts of one version -> the update the generators pull."""
    if all(isinstance(p, Manifest) for p in parts):
        if len(parts) != 1:
            raise ValueError(f"a one-process trainer answered with {len(parts)} manifests")
        return parts[0]  # type: ignore[return-value]
    shards = [p for p in parts if isinstance(p, ShardManifest)]
    if len(shards) != len(parts):
        raise ValueError("trainer ranks answered with different kinds of weight manifests")
    return dtensor_reshard.merge(shards)


@dataclasses.dataclass(frozen=True)
class WeightSync:
    """One generator's pull: the version it now runs (the update's, or a newer one the
    publisher staged meanwhile), the seconds the pull took, and how the bytes came
    (`rdma_tensor.Transport` values: "shm" or "cuda_ipc" from the trainer's machine, "rdma"
    from another; a sharded pull from ranks on several machines joins them with "+")."""

    version: int
    seconds: float
    transport: str = ""


def transports(values: Iterable[Transport | str]) -> str:
    """ "rdma+shm" for the transports of one or more pulls (each once, sorted)."""
    names = {v.value if isinstance(v, Transport) else v for v in values}
    return "+".join(sorted(t for name in names for t in name.split("+") if t))


def oldest(syncs: Sequence[WeightSync]) -> WeightSync:
    """Every generator's pull of one update as one: the oldest version they run, the
    slowest pull, and every transport used."""
    return WeightSync(
        min(s.version for s in syncs),
        max(s.seconds for s in syncs),
        transports(s.transport for s in syncs),
    )


async def pull(
    update: WeightUpdate, model: PreTrainedModel, adapter: Mapping[str, Tensor] | None = None
) -> WeightSync:
    """Installs `update` into `model`, all or nothing (a failed pull leaves the running
    weights untouched), cast to the model's dtype; with `adapter` (`model.lora.adapter_state`
    of the `PeftModel` around `model`), into the adapter's tensors alone."""
    if adapter is not None:
        if isinstance(update, ShardedManifest):
            raise TypeError("a sharded trainer's update holds whole weights, not an adapter")
        adapted = await rdma_tensor.pull(update, into=adapter, allow_cast=True)
        return WeightSync(adapted.version, adapted.seconds, adapted.transport.value)
    if isinstance(update, ShardedManifest):
        # The trainer's layouts name parameters (a tied head appears once).
        params = {n: p.detach() for n, p in model.named_parameters()}
        shards = await dtensor_reshard.pull(update, into=params, allow_cast=True)
        return WeightSync(shards.version, shards.seconds, transports(shards.transports))
    whole = await rdma_tensor.pull(update, into=model.state_dict(), allow_cast=True)
    return WeightSync(whole.version, whole.seconds, whole.transport.value)
