"""Example 07: weight sync through CPU staging and a pull; the trainer never waits.

What it teaches
    A trainer trains; a generator samples with the trainer's weights and wants new ones
    often. With `packages/rdma-tensor`:

      1. after each optimizer step the trainer calls `publisher.publish(state_dict, v)`: one
         copy of the weights into CPU *staging* memory, and a small `Manifest` comes back;
      2. it posts the manifest on a board actor with `broadcast` (the control plane: a few KB,
         not awaited) and starts its next step at once;
      3. between two batches the generator asks the board for the newest manifest and calls
         `await subscriber.pull(manifest)`, which copies the newest complete version out of
         staging into its model, all or nothing (the data plane). The trainer takes no part.

    That copy is what a GPU generator or one on another machine does. `--mode auto` lets a
    generator on the trainer's machine with its model in CPU memory *map* the staging
    memory instead (nothing copied); `--transport rdma` reads through Monarch's
    `RDMABuffer`, the path between machines (over TCP here, without RDMA cards).

What to look at
    The timeline: trainer steps back to back, pulls in the middle of them, the generator
    skipping versions when it is slower. Then the trainer's cost per version against a
    training step, and the checks: every pulled version bit-identical to what was published.

Run
    uv run python examples/07_weight_sync.py
    uv run python examples/07_weight_sync.py --mode auto
    uv run python examples/07_weight_sync.py --transport rdma
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import pickle
import statistics
import time
from collections.abc import Mapping

import torch
from _checks import expect
from monarch.actor import Actor, endpoint, this_host, this_proc
from rdma_tensor import (
    Manifest,
    Publisher,
    PublisherConfig,
    RdmaTensorError,
    Subscriber,
    SyncMode,
    Transport,
)
from torch import nn

WIDTH, LAYERS, BATCH = 768, 4, 256  # 4 Linear(768, 768): 9.4 MB of float32 weights
Span = tuple[float, float]  # (start, end), monotonic seconds, comparable across processes
Pulled = tuple[int, bool, str]  # (version, mapped, digest of the weights after the pull)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())])


def digest(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 of every weight's bytes: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for t in state.values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


class Board(Actor):
    """The control plane: holds the newest manifest the trainer posted."""

    def __init__(self) -> None:
        self.latest: Manifest | None = None

    @endpoint
    async def post(self, manifest: Manifest) -> None:
        self.latest = manifest

    @endpoint
    async def newest(self) -> Manifest | None:
        return self.latest


class Trainer(Actor):
    """Trains a small MLP on a fixed regression task and publishes every version."""

    def __init__(self, transport: Transport | None) -> None:
        torch.set_num_threads(1)  # two busy processes share the cores
        self.model = make_model(seed=0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.x, self.y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
        self.publisher = Publisher(PublisherConfig(transport=transport))
        self.published: dict[int, dict[str, torch.Tensor]] = {}

    @endpoint
    async def train(self, steps: int, board: Board) -> list[tuple[float, float, float]]:
        """Returns (start, trained, staged) times of each step."""
        log = []
        for version in range(1, steps + 1):
            start = time.monotonic()
            self.opt.zero_grad()
            loss = nn.functional.mse_loss(self.model(self.x), self.y)
            loss.backward()  # type: ignore[no-untyped-call]
            self.opt.step()
            trained = time.monotonic()
            manifest = self.publisher.publish(self.model.state_dict(), version)  # one copy
            board.post.broadcast(manifest)  # a small message; nobody is waited for
            log.append((start, trained, time.monotonic()))
            state = self.model.state_dict()  # for the checks only: a copy of each version
            self.published[version] = {k: t.clone() for k, t in state.items()}
        return log

    @endpoint
    async def digests(self) -> dict[int, str]:
        return {v: digest(m) for v, m in self.published.items()}

    @endpoint
    async def close(self) -> None:
        self.publisher.close()


class Generator(Actor):
    """Samples in a loop; between two batches, pulls the newest version if there is one."""

    def __init__(self, mode: SyncMode) -> None:
        torch.set_num_threads(1)
        self.model = make_model(seed=99)  # different weights until the first pull
        self.weights = Subscriber(self.model, mode=mode)  # remembers the version it holds
        self.prompts = torch.randn(BATCH, WIDTH)

    @endpoint
    async def run(self, board: Board, last: int) -> tuple[list[Span], list[Pulled]]:
        """Returns the (start, end) of each pull and (version, mapped, digest) after it."""
        times: list[Span] = []
        pulls: list[Pulled] = []
        while (self.weights.version or 0) < last:
            manifest = await board.newest.call_one()
            if manifest is not None and manifest.version > (self.weights.version or 0):
                start = time.monotonic()
                result = await self.weights.pull(manifest)  # newest complete version, whole
                times.append((start, time.monotonic()))
                pulls.append((result.version, result.mapped, digest(self.model.state_dict())))
            with torch.no_grad():  # "sampling": forward passes with the weights it holds
                for _ in range(6):
                    self.model(self.prompts)
        return times, pulls

    @endpoint
    async def after_close(self, manifest: Manifest) -> tuple[str, str]:
        """(digest of the weights held, the error a further pull raises)."""
        try:
            await self.weights.pull(manifest, timeout=10.0)
        except RdmaTensorError as e:
            return digest(self.model.state_dict()), type(e).__name__
        return digest(self.model.state_dict()), "no error"


def lanes(steps: list[tuple[float, float, float]], pulls: list[Span]) -> None:
    """Both processes on one time axis: T train, s stage and post, P pull, . sample."""
    t0, end, width = steps[0][0], max(steps[-1][2], pulls[-1][1]), 96
    dt = (end - t0) / width
    trainer, generator = [" "] * width, ["."] * width
    for lane, a, b, mark in [(trainer, s, t, "T") for s, t, _ in steps] + [
        (trainer, t, e, "s") for _, t, e in steps
    ] + [(generator, a, b, "P") for a, b in pulls]:  # fmt: skip
        for i in range(int((a - t0) / dt), min(width, int((b - t0) / dt) + 1)):
            lane[i] = mark
    print(f"\n{dt * 1e3:.0f} ms per character; T train, s stage + post, . sample, P pull")
    print("  trainer   |" + "".join(trainer) + "|")
    print("  generator |" + "".join(generator) + "|")


async def main() -> None:
    parser = argparse.ArgumentParser(description="weight sync through CPU staging")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument("--mode", choices=["copy", "auto", "map"], default="copy")
    parser.add_argument("--transport", choices=["shm", "rdma"], default=None)
    args = parser.parse_args()
    if args.mode == "map" and args.transport == "rdma":
        parser.error("--mode map needs the same machine: an RDMA read can only be copied")
    transport = Transport(args.transport) if args.transport else None

    trainer_procs = this_host().spawn_procs(per_host={"procs": 1}, name="trainer")
    generator_procs = this_host().spawn_procs(per_host={"procs": 1}, name="generator")
    try:
        board = this_proc().spawn("board", Board)
        trainer = trainer_procs.spawn("trainer", Trainer, transport)
        generator = generator_procs.spawn("generator", Generator, args.mode)
        steps, (times, pulls) = await asyncio.gather(  # two loops; neither calls the other
            trainer.train.call_one(args.steps, board), generator.run.call_one(board, args.steps)
        )
        published = await trainer.digests.call_one()
        manifest = await board.newest.call_one()
        assert manifest is not None
        await trainer.close.call_one()
        held, error = await generator.after_close.call_one(manifest)
    finally:
        await generator_procs.stop()
        await trainer_procs.stop()

    lanes(steps, times)
    train = statistics.median(t - s for s, t, _ in steps)
    stage = statistics.median(e - t for _, t, e in steps[1:])  # the first also allocates
    pull = statistics.median(b - a for a, b in times)
    how = "mapped" if all(m for _, m, _ in pulls) else "copied"
    print(f"\nweights: {manifest.nbytes / 1e6:.1f} MB; the manifest pickled: ", end="")
    print(f"{len(pickle.dumps(manifest)):,} bytes")
    print(f"trainer, medians: a step {1e3 * train:.1f} ms, stage + post {1e3 * stage:.1f} ms")
    print(f"generator: {len(pulls)} pulls, {how}, median {1e3 * pull:.1f} ms; held ", end="")
    print(" ".join(f"v{v}" for v, _, _ in pulls))

    versions = [v for v, _, _ in pulls]
    expect(versions == sorted(set(versions)) and versions[-1] == args.steps, "versions only rose")
    expect(all(published[v] == d for v, _, d in pulls), "every pulled version is bit-identical")
    inside = sum(any(s < a and b < e for s, _, e in steps) for a, b in times)
    expect(inside >= 1, f"{inside} pulls began and ended inside one trainer step: no one waited")
    maps = args.mode == "map" or (args.mode == "auto" and args.transport != "rdma")
    expect(all(m == maps for _, m, _ in pulls), f"every pull {'mapped' if maps else 'copied'}")
    expect(held == published[args.steps], "after the trainer closed, the weights were intact")
    expect(error == "PublisherClosedError", f"and a further pull raised {error}")


if __name__ == "__main__":
    asyncio.run(main())
