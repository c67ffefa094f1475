"""What the pull paths (`_pull_shm`, `_pull_rdma`) share: checking the destination against
the manifest, the copy plan, the goal of a pull, its outcome, and helpers over slot headers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rdma_tensor.errors import MismatchError, PublisherClosedError, PullTimeoutError
from rdma_tensor.manifest import Manifest, TensorEntry
from rdma_tensor.staging import SlotHeader, SlotState

Plan = list[tuple[TensorEntry, torch.Tensor]]
"""Every published entry with the destination tensor it goes into."""


@dataclass(frozen=True)
class Goal:
    """What a pull waits for: a complete version >= `want`, until `deadline` (monotonic
    seconds; `wait_s` is the timeout it came from). `applied` is what `into` holds now."""

    want: int
    applied: int | None
    deadline: float
    wait_s: float


@dataclass(frozen=True)
class Outcome:
    """What a pull path did: `version` now in `into` (`changed`: whether it copied), or, when
    `views` is set, the leased views of that version for the caller to swap in."""

    version: int
    changed: bool
    nbytes: int
    copy_seconds: float
    retries: int = 0
    pipelined: bool = False
    views: Mapping[str, torch.Tensor] | None = None


def check_destination(
    manifest: Manifest, into: Mapping[str, torch.Tensor], allow_cast: bool
) -> Plan:
    """Pairs every manifest entry with its destination; lists every misfit at once."""
    if not isinstance(into, Mapping):
        raise TypeError(f"into must be a mapping of name to tensor, got {type(into).__name__}")
    entries = manifest.bucket_layout.entries
    problems = []
    published = {e.name for e in entries}
    missing = [e.name for e in entries if e.name not in into]
    extra = [n for n in into if n not in published]
    if missing:
        problems.append(f"missing from into: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if extra:
        problems.append(f"not published: {extra[:8]}{' ...' if len(extra) > 8 else ''}")
    plan: Plan = []
    for e in entries:
        value: object = into.get(e.name)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(f"{e.name}: not a tensor ({type(value).__name__})")
            continue
        dst = value
        if tuple(dst.shape) != e.shape:
            problems.append(f"{e.name}: shape {list(dst.shape)}, published {list(e.shape)}")
        if dst.dtype != e.dtype and not (
            allow_cast and dst.dtype.is_floating_point and e.dtype.is_floating_point
        ):
            hint = "" if allow_cast else " (allow_cast=True converts floating point)"
            problems.append(f"{e.name}: dtype {dst.dtype}, published {e.dtype}{hint}")
        if dst.device.type not in ("cpu", "cuda"):
            problems.append(f"{e.name}: on {dst.device}; only cpu and cuda are supported")
        plan.append((e, dst))
    if problems:
        raise MismatchError(
            f"into does not fit version {manifest.version} of the published state dict:\n  "
            + "\n  ".join(problems)
        )
    return plan


def copy_entries(plan: Plan, buckets: Sequence[torch.Tensor]) -> None:
    """Copies every entry from its bucket bytes into its destination (casting if needed)."""
    with torch.no_grad():
        for e, dst in plan:
            src = buckets[e.bucket][e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)
            # Asynchronous into CUDA memory: the synchronize below ends every copy before
            # the caller lets go of the source (from pageable memory it is synchronous anyway).
            dst.copy_(src, non_blocking=dst.is_cuda)
    for device in {dst.device for _, dst in plan if dst.is_cuda}:
        torch.cuda.synchronize(device)


def plan_bytes(plan: Plan) -> int:
    return sum(e.nbytes for e, _ in plan)


def newest(headers: Sequence[SlotHeader], want: int, state: SlotState) -> int | None:
    """The slot holding the newest version >= want in `state` (COMPLETE: fully complete)."""
    best = None
    for i, h in enumerate(headers):
        ok = h.complete if state is SlotState.COMPLETE else h.state is state
        if ok and h.version >= want and (best is None or h.version > headers[best].version):
            best = i
    return best


def timeout_error(goal: Goal, headers: Sequence[SlotHeader]) -> PullTimeoutError:
    held = ", ".join(f"{h.state.name.lower()} v{h.version}" for h in headers)
    return PullTimeoutError(
        f"version >= {goal.want} was not staged within {goal.wait_s}s (slots: {held})"
    )


def check_not_closed(headers: Sequence[SlotHeader]) -> None:
    if any(h.state is SlotState.CLOSED for h in headers):
        raise PublisherClosedError("the publisher was closed")
