"""Example 03: handle versus payload (control plane and data plane).

What it teaches
    Actor A (the holder) owns a big tensor, standing in for model weights. Actor B (the
    puller), in another process, wants a copy. There are two ways to get it there:

      payload   A returns the tensor itself; every byte rides inside the reply message.
      handle    A returns an `RDMABuffer`, a few hundred bytes that *point at* its memory.
                B then calls `handle.read_into(dst)`, and Monarch's RDMA layer copies the
                bytes from A's memory into B's preallocated tensor. A's endpoint only ever
                returned the pointer; it never touches the bytes.

    The handle is the control plane (small, cheap messages that say what to do); the read is
    the data plane (bulk bytes, moved directly). A handle is a pointer, not a snapshot: when A
    changes the tensor in place, B's next read through the same handle sees the new values.
    That is what makes it useful for weight sync, and also why a reader must never read while
    the owner writes (the weight-sync chapter deals with that with versions).

What to look at
    The message sizes (the pickled handle against the pickled tensor), the time of each path,
    and the backend line. On a machine without RDMA NICs (ibverbs), Monarch falls back to
    sending the read as chunked messages over TCP between its own per-process RDMA managers
    (it warns `RDMATcpFallbackWarning`). Then both paths push the bytes through local
    sockets, and the times say nothing about RDMA hardware, where the NIC copies the bytes
    without either process's CPU. What holds everywhere is the shape of the design: the
    owner hands out a pointer once and never pushes bytes itself, and the reader decides
    when to pull and where the bytes land. The first round also pays for connection set-up.

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
from dataclasses import dataclass

import torch
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer, get_rdma_backend


def fingerprint(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes: equal fingerprints mean bit-identical tensors."""
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Pull:
    """One transfer as the puller measured it.

    `ask_s`: seconds from sending the request to holding the reply (for the payload path
    that reply *is* the data). `read_s`: seconds spent in `read_into` (0 for the payload
    path). `fingerprint`: of the bytes the puller ended up with.
    """

    ask_s: float
    read_s: float
    fingerprint: str

    @property
    def total_s(self) -> float:
        return self.ask_s + self.read_s


class Holder(Actor):
    """Owns the tensor; hands out either the bytes or a handle to them."""

    def __init__(self, numel: int) -> None:
        self.weights = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        self.buffer: RDMABuffer | None = None

    @endpoint
    async def handle(self) -> RDMABuffer:
        # Registering memory is the expensive part of a handle; do it once and reuse it.
        if self.buffer is None:
            self.buffer = RDMABuffer(self.weights)
        return self.buffer

    @endpoint
    async def payload(self) -> torch.Tensor:
        return self.weights

    @endpoint
    async def message_sizes(self) -> tuple[int, int]:
        """(pickled handle, pickled tensor) in bytes: what each reply has to carry."""
        if self.buffer is None:
            self.buffer = RDMABuffer(self.weights)
        return len(pickle.dumps(self.buffer)), len(pickle.dumps(self.weights))

    @endpoint
    async def update_in_place(self) -> str:
        """Changes every value without moving the memory; returns the new fingerprint."""
        self.weights.mul_(0.5).add_(1.0)
        return fingerprint(self.weights)

    @endpoint
    async def fingerprint(self) -> str:
        return fingerprint(self.weights)

    @endpoint
    async def release(self) -> None:
        if self.buffer is not None:
            await self.buffer.drop()
            self.buffer = None


class Puller(Actor):
    """Wants a copy of the holder's tensor, in a buffer it allocated once."""

    def __init__(self, holder: Holder, numel: int) -> None:
        self.holder = holder
        self.dst = torch.empty(numel)
        self.cached: RDMABuffer | None = None

    @endpoint
    async def via_handle(self) -> Pull:
        t0 = time.perf_counter()
        self.cached = await self.holder.handle.call_one()
        t1 = time.perf_counter()
        await self.cached.read_into(self.dst)
        t2 = time.perf_counter()
        return Pull(ask_s=t1 - t0, read_s=t2 - t1, fingerprint=fingerprint(self.dst))

    @endpoint
    async def via_payload(self) -> Pull:
        t0 = time.perf_counter()
        received = await self.holder.payload.call_one()
        t1 = time.perf_counter()
        self.dst.copy_(received)
        return Pull(ask_s=t1 - t0, read_s=0.0, fingerprint=fingerprint(self.dst))

    @endpoint
    async def reread_cached_handle(self) -> str:
        """Reads again through the handle it already holds, without asking the holder."""
        if self.cached is None:
            raise RuntimeError("no handle yet: call via_handle first")
        await self.cached.read_into(self.dst)
        return fingerprint(self.dst)


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:8.1f} ms"


async def demo(holder: Holder, puller: Puller, mib: int, rounds: int) -> None:
    backend = get_rdma_backend()
    print(f"RDMA backend here: {backend}")
    if backend == "tcp":
        print("  (no ibverbs NIC: read_into runs over Monarch's TCP fallback; the times below")
        print("   are TCP-fallback times on this machine, not RDMA times)")

    handle_bytes, tensor_bytes = await holder.message_sizes.call_one()
    print("\nwhat each reply message carries")
    print(f"  handle path:  {handle_bytes:>12,} bytes  (then {mib} MiB pulled by read_into)")
    print(f"  payload path: {tensor_bytes:>12,} bytes  (the tensor, inside the message)")
    print(f"  the handle message is {tensor_bytes / handle_bytes:,.0f}x smaller")
    expect(handle_bytes < 4096, "the handle is a small message (under 4 KiB)")

    print(f"\n{rounds} rounds, each moving {mib} MiB from the holder into the puller")
    print("  round   handle: ask     read_into      total  |  payload: total")
    expected = await holder.fingerprint.call_one()
    by_handle: list[Pull] = []
    by_payload: list[Pull] = []
    for r in range(1, rounds + 1):
        h = await puller.via_handle.call_one()
        p = await puller.via_payload.call_one()
        by_handle.append(h)
        by_payload.append(p)
        print(f"  {r:>5}  {ms(h.ask_s)} {ms(h.read_s)} {ms(h.total_s)}  |  {ms(p.total_s)}")
    h_med = statistics.median(x.total_s for x in by_handle)
    p_med = statistics.median(x.total_s for x in by_payload)
    ask_med = statistics.median(x.ask_s for x in by_handle)
    print(f"  median: handle {ms(h_med)} (of which the handle message {ms(ask_med)}),")
    print(f"          payload {ms(p_med)};  payload/handle = {p_med / h_med:.2f}")
    print(f"  read_into moved {mib / statistics.median(x.read_s for x in by_handle):,.0f} MiB/s")
    expect(
        all(x.fingerprint == expected for x in by_handle + by_payload),
        f"every copy is bit-identical to the holder's tensor ({expected})",
    )

    print("\na handle points at memory; it is not a snapshot")
    changed = await holder.update_in_place.call_one()
    seen = await puller.reread_cached_handle.call_one()
    print(f"  holder changed its tensor in place -> {changed}")
    print(f"  puller re-read with the handle it already had -> {seen}")
    expect(seen == changed and changed != expected, "the old handle reads the new values")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    args = parser.parse_args()
    if args.mib < 1 or args.rounds < 1:
        parser.error("--mib and --rounds must be at least 1")
    numel = args.mib * 2**20 // 4  # float32

    # Two separate processes, so every byte really crosses a process boundary.
    holder_procs = this_host().spawn_procs(per_host={"procs": 1}, name="holder")
    puller_procs = this_host().spawn_procs(per_host={"procs": 1}, name="puller")
    try:
        holder = holder_procs.spawn("holder", Holder, numel)
        # An actor reference is an ordinary argument: B gets a way to reach A at spawn time.
        puller = puller_procs.spawn("puller", Puller, holder, numel)
        await demo(holder, puller, args.mib, args.rounds)
        await holder.release.call_one()
    finally:
        await puller_procs.stop()
        await holder_procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
