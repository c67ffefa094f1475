"""`pull`: one copy of a published version into existing tensors, with no memory between
calls. A generator that pulls again and again should keep a `Subscriber` instead.

    result = await pull(manifest, into=model.state_dict())   # in place, all or nothing

`pull(source, into=..., ...)` is exactly `Subscriber(into, mode="copy").pull(source, ...)` on
a fresh `Subscriber`: it checks `into` against the manifest before touching anything, waits
for a version at least as new as the manifest's (or `min_version`) and copies the newest one
in. Because it remembers nothing, it always copies (even the version `into` already holds),
never pipelines (it cannot know which staged version `into` holds to fall back on) and cannot
refuse a version older than what `into` holds. A `Subscriber` knows its version and does all
three; on the publisher's machine it can also map the weights instead of copying them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from rdma_tensor.manifest import Manifest
from rdma_tensor.subscriber import PullResult, Subscriber
from rdma_tensor.transport import Transport

if TYPE_CHECKING:
    from rdma_tensor.actors import WeightPublisher

__all__ = ["PullResult", "pull"]


async def pull(
    source: Manifest | WeightPublisher,
    *,
    into: Mapping[str, torch.Tensor] | torch.nn.Module,
    allow_cast: bool = False,
    min_version: int | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109 - bounds waiting for the version, not one await
    transport: Transport | None = None,
) -> PullResult:
    """Copies the newest completely staged version >= the manifest's into `into`, in place.

    source: a `Manifest` from `Publisher.publish`, or a `WeightPublisher` actor (its latest
        manifest is fetched).
    into: the destination state dict (CPU or CUDA tensors; any strides), or a module. It
        must have exactly the published names and shapes, and the same dtypes unless
        `allow_cast` (floating point to floating point only, e.g. float32 -> bfloat16).
    min_version: wait for at least this version (default: the manifest's).
    timeout: seconds to wait for the version before raising `PullTimeoutError`.
    transport: force a transport (default: the publisher's choice, else auto).

    Raises `MismatchError` for names/shapes/dtypes that do not fit, `PublisherClosedError` /
    `PublisherDiedError` when the publisher closed or died, `PullTimeoutError`. On any error
    `into` is unchanged. See the module docstring for what it does not do.
    """
    subscriber = Subscriber(into, mode="copy", transport=transport)
    return await subscriber.pull(
        source, allow_cast=allow_cast, min_version=min_version, timeout=timeout
    )
