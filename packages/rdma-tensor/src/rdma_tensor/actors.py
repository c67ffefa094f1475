"""A Monarch actor pair for apps that want weight sync as actors.

Subclass them (endpoints are async, so a subclass's endpoints must be async too):

    class Trainer(WeightPublisher):
        @endpoint
        async def step(self) -> Manifest:
            ...                                      # train
            return self.publish_weights(self.model.state_dict(), self.version)

    class Generator(WeightSubscriber):
        def weights(self) -> torch.nn.Module:     # or a state dict (then always copied)
            return self.model

    await generator.update_weights.call(trainer)     # or pass a Manifest

The bytes never travel in these messages: only manifests do.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from monarch.actor import Actor, endpoint

from rdma_tensor.manifest import Manifest
from rdma_tensor.publish import Publisher, PublisherConfig
from rdma_tensor.subscriber import PullResult, Subscriber, SyncMode


class WeightPublisher(Actor):
    """Owns a `Publisher`; the subclass calls `publish_weights` after each update."""

    def __init__(self, config: PublisherConfig | None = None) -> None:
        self.publisher = Publisher(config)

    def publish_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Manifest:
        """Stages `state_dict` as `version` (one copy) and returns its manifest."""
        return self.publisher.publish(state_dict, version)

    @endpoint
    async def latest_manifest(self) -> Manifest:
        """The newest published manifest; raises `LookupError` before the first publish."""
        manifest = self.publisher.latest
        if manifest is None:
            raise LookupError("nothing has been published yet")
        return manifest

    @endpoint
    async def close_publisher(self) -> None:
        """Closes the staging memory; later pulls fail with `PublisherClosedError`."""
        self.publisher.close()


class WeightSubscriber(Actor):
    """Applies published versions to `weights()`, which the subclass provides, through a
    `Subscriber` built on the first update (`mode`: see `Subscriber`)."""

    def __init__(self, mode: SyncMode = "auto") -> None:
        self.weights_version: int | None = None
        self._mode: SyncMode = mode
        self._subscriber: Subscriber | None = None

    def weights(self) -> torch.nn.Module | Mapping[str, torch.Tensor]:
        """The destination, called once: the model itself (on the publisher's machine its
        weights are then mapped, not copied) or a state dict to update in place."""
        raise NotImplementedError("WeightSubscriber subclasses must implement weights()")

    @property
    def subscriber(self) -> Subscriber:
        """The `Subscriber` that owns `weights()` and the version it holds."""
        if self._subscriber is None:
            self._subscriber = Subscriber(self.weights(), mode=self._mode)
        return self._subscriber

    @endpoint
    async def update_weights(
        self, source: Manifest | WeightPublisher, allow_cast: bool = False, timeout_s: float = 60.0
    ) -> PullResult:
        """Pulls the newest version >= `source`'s into `weights()` (see `Subscriber.pull`)."""
        result = await self.subscriber.pull(source, allow_cast=allow_cast, timeout=timeout_s)
        self.weights_version = result.version
        return result

    @endpoint
    async def current_version(self) -> int | None:
        """The version `weights()` holds, None before the first update."""
        return self.weights_version
