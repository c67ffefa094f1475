"""Example 03: handle versus payload (control plane and data plane).

What it teaches
    The holder, in one process, owns a big tensor standing in for model weights. The puller,
    in another, wants a copy. Two ways to get it there:

      payload   the holder returns the tensor itself: every byte rides inside the reply.
      handle    the holder returns an `RDMABuffer`, a few hundred bytes that *point at* its
                memory; the puller calls `handle.read_into(dst)` and the bytes go straight
                into the puller's tensor. The holder's code never touches them.

    The handle is the control plane (small messages that say what to do); the read is the
    data plane (bulk bytes, moved directly). A handle is a pointer, not a snapshot: when the
    holder changes the tensor in place, a re-read through the old handle sees new values.

What to look at
    The two message sizes, the times of both paths, and the backend line. Without RDMA
    network cards Monarch sends the read over TCP (it warns `RDMATcpFallbackWarning`): both
    paths then push bytes through local sockets, and the times say nothing about RDMA
    hardware. The shape of the design holds everywhere.

Run
    uv run python examples/03_rdma_transfer.py            # 64 MiB, 3 rounds
    uv run python examples/03_rdma_transfer.py --mib 256 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import pickle
import statistics
import time

import torch
from _checks import expect
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer, get_rdma_backend


def digest(t: torch.Tensor) -> str:
    """sha256 of the raw bytes: equal digests mean bit-identical tensors."""
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:12]


class Holder(Actor):
    """Owns the tensor; hands out either the bytes or a handle to them."""

    def __init__(self, numel: int) -> None:
        self.weights = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        self.buffer = RDMABuffer(self.weights)  # registering memory is done once

    @endpoint
    async def handle(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    async def payload(self) -> torch.Tensor:
        return self.weights

    @endpoint
    async def message_sizes(self) -> tuple[int, int]:
        """(pickled handle, pickled tensor) in bytes: what each reply has to carry."""
        return len(pickle.dumps(self.buffer)), len(pickle.dumps(self.weights))

    @endpoint
    async def digest(self) -> str:
        return digest(self.weights)

    @endpoint
    async def update_in_place(self) -> str:
        self.weights.mul_(0.5).add_(1.0)
        return digest(self.weights)


class Puller(Actor):
    """Wants a copy of the holder's tensor, in a buffer it allocated once."""

    def __init__(self, holder: Holder, numel: int) -> None:
        self.holder = holder  # an actor reference is an ordinary argument
        self.dst = torch.empty(numel)
        self.handle: RDMABuffer | None = None

    @endpoint
    async def via_handle(self) -> float:
        t0 = time.perf_counter()
        self.handle = await self.holder.handle.call_one()  # control plane: ~540 bytes
        await self.handle.read_into(self.dst)  # data plane: the bytes
        return time.perf_counter() - t0

    @endpoint
    async def via_payload(self) -> float:
        t0 = time.perf_counter()
        self.dst.copy_(await self.holder.payload.call_one())  # the bytes in the message
        return time.perf_counter() - t0

    @endpoint
    async def digest(self) -> str:
        return digest(self.dst)

    @endpoint
    async def reread(self) -> str:
        """Reads again through the handle it already has, without asking the holder."""
        assert self.handle is not None
        await self.handle.read_into(self.dst)
        return digest(self.dst)


async def demo(holder: Holder, puller: Puller, mib: int, rounds: int) -> None:
    backend = get_rdma_backend()
    print(f"RDMA backend: {backend}" + (" (no RDMA cards: TCP fallback)" * (backend == "tcp")))
    handle_bytes, tensor_bytes = await holder.message_sizes.call_one()
    print(f"reply message: handle {handle_bytes:,} bytes, payload {tensor_bytes:,} bytes")

    by_handle = [await puller.via_handle.call_one() for _ in range(rounds)]
    copied, original = await puller.digest.call_one(), await holder.digest.call_one()
    by_payload = [await puller.via_payload.call_one() for _ in range(rounds)]
    h, p = statistics.median(by_handle), statistics.median(by_payload)
    print(f"moving {mib} MiB, median of {rounds}: handle + read_into {1e3 * h:.1f} ms, ", end="")
    print(f"payload {1e3 * p:.1f} ms")

    changed = await holder.update_in_place.call_one()
    seen = await puller.reread.call_one()
    print(f"the holder changed its tensor in place: {original} -> {changed}")
    print(f"the puller re-read through the handle it already had: {seen}")

    expect(handle_bytes < 4096, "the handle is a small message, whatever the tensor's size")
    expect(copied == original, "read_into copied the tensor bit for bit")
    expect(seen == changed, "a handle is a pointer, not a snapshot: it reads the new values")


async def main() -> None:
    parser = argparse.ArgumentParser(description="handle versus payload")
    parser.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    args = parser.parse_args()
    if args.mib < 1 or args.rounds < 1:
        parser.error("--mib and --rounds must be at least 1")
    numel = args.mib * 2**20 // 4  # float32

    holder_procs = this_host().spawn_procs(per_host={"procs": 1}, name="holder")
    puller_procs = this_host().spawn_procs(per_host={"procs": 1}, name="puller")
    try:
        holder = holder_procs.spawn("holder", Holder, numel)
        puller = puller_procs.spawn("puller", Puller, holder, numel)
        await demo(holder, puller, args.mib, args.rounds)
    finally:
        await puller_procs.stop()
        await holder_procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
