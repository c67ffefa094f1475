"""Example 07: weight sync with CPU staging and a pull; the trainer never stops.

What it teaches
    A trainer trains; a generator samples with the trainer's weights and wants new ones
    often. With `packages/rdma-tensor` the hand-over costs the trainer one copy:

      1. after each optimizer step the trainer calls `Publisher.publish(state_dict, version)`:
         the weights are copied into a *staging* slot (CPU memory; on a GPU machine this is
         the device-to-host copy) and a small `Manifest` comes back;
      2. the trainer posts the manifest on a notice board (an actor message of a few hundred
         bytes per tensor, however large the tensors; sent with `broadcast`, so the trainer
         does not wait for it) and starts its next step at once;
      3. the generator keeps a `Subscriber(model)`, and between two batches asks the board
         for the newest manifest and calls `await subscriber.pull(manifest)`: it applies the
         newest complete version, all or nothing. Here (same machine, CPU model, same
         dtypes) it *maps* it: the model's parameters are re-pointed to read-only views of
         the trainer's staging slot, and nothing is copied. Elsewhere (another machine, a
         GPU model, a dtype cast, `--mode copy`) it copies the bytes into the model's own
         tensors instead. The trainer's process takes no part in either.

    The manifest is the control plane; the pulled bytes are the data plane. A mapped
    generator runs on the staging slot of the version it holds, and its views keep that slot
    leased: the trainer writes its new versions into the other slot (two by default: one
    for each mapping generator, plus one), so neither waits for the other, and no reader
    ever sees half of one version and half of the next.

What to look at
    The timeline: trainer steps one after another, with pulls starting and ending in the
    middle of them; the versions the generator holds (it skips versions when it is slower
    than the trainer: it always takes the newest). Then the trainer's cost per version (the
    staging copy) against a training step, whether each pull mapped or copied, and the
    checks: every version the generator pulled is bit-identical to what the trainer
    published, and the weights it sampled with did not change under it between two pulls,
    although they were the trainer's staging memory. Last, the trainer closes its publisher:
    the mapped weights stay valid, and the next pull fails with a clear error.

    On one machine the bytes move through shared memory: the generator maps the trainer's
    staging memory and runs on it (with `--mode copy`, copies out of it). `--transport rdma`
    forces Monarch's `RDMABuffer` instead, the path used between machines, which can only
    copy; without RDMA NICs Monarch runs it over TCP (and warns `RDMATcpFallbackWarning`),
    so expect slower pulls; the trainer still never waits for them.

Run
    uv run python examples/07_weight_sync.py
    uv run python examples/07_weight_sync.py --mode copy
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
from dataclasses import dataclass
from itertools import pairwise

import torch
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

WIDTH, LAYERS = 768, 4  # 4 x 768 x 768 float32 weights (+ biases): about 9.5 MB
BATCH = 256


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 of every tensor's raw bytes, in order: equal means bit-identical weights."""
    h = hashlib.sha256()
    for t in state.values():
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Step:
    """One trainer step (monotonic-clock seconds, comparable across processes on a host).

    `start` -> `trained`: forward, backward, optimizer step. `trained` -> `staged`: the
    publish (copy into staging) and the notice; `publish_cpu` is the CPU time the trainer's
    thread spent on it (on a busy machine, wall time also counts time spent descheduled).
    `staged` -> `end`: this example's own bookkeeping (keeping a copy of the version to
    check the generator against later), which a real trainer would not do.
    """

    version: int
    start: float
    trained: float
    staged: float
    end: float
    publish_cpu: float
    loss: float


@dataclass(frozen=True)
class Pull:
    """One pull by the generator: when, what it held before, what it holds after.

    `mapped`: the model now runs on views of the staging slot (False: the bytes were copied
    into its own tensors; `nbytes` were mapped or copied). `cpu`: CPU time of the
    generator's thread during the pull (wall time also counts time spent descheduled; over
    RDMA, Monarch's own threads move the bytes). `held_fingerprint`: the weights
    just before this pull, i.e. what the generator sampled with since the previous one;
    `fingerprint`: the weights just after it.
    """

    start: float
    end: float
    before: int
    version: int
    nbytes: int
    transport: str
    mapped: bool
    cpu: float
    retries: int
    held_fingerprint: str
    fingerprint: str


@dataclass(frozen=True)
class AfterClose:
    """The generator once the trainer closed its publisher.

    `mapped`: its weights were still views of the closed publisher's staging memory;
    `fingerprint`: those weights; `pull_error`: the error a further pull raised ("" if none);
    `unmapped_fingerprint`: the weights after `unmap()` moved them into its own memory.
    """

    mapped: bool
    fingerprint: str
    pull_error: str
    unmapped_fingerprint: str


@dataclass(frozen=True)
class Batch:
    """One batch the generator sampled, and the weights version it sampled with."""

    start: float
    end: float
    version: int


class Board(Actor):
    """The control plane: holds the newest manifest the trainer posted."""

    def __init__(self) -> None:
        self.latest: Manifest | None = None

    @endpoint
    async def post(self, manifest: Manifest) -> None:
        if self.latest is None or manifest.version > self.latest.version:
            self.latest = manifest

    @endpoint
    async def newest(self) -> Manifest | None:
        return self.latest


class Trainer(Actor):
    """Trains a small MLP on a fixed regression task and publishes every version."""

    def __init__(self, transport: Transport | None) -> None:
        torch.set_num_threads(1)  # two busy processes share two cores
        self.model = make_model(seed=0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(BATCH, WIDTH, generator=g)
        self.y = torch.randn(BATCH, WIDTH, generator=g)
        # Two slots (the default): a mapping generator pins the one it runs on, the trainer
        # writes the other. With M mapping generators, use slots=M + 1.
        self.publisher = Publisher(PublisherConfig(transport=transport))
        self.history: dict[int, dict[str, torch.Tensor]] = {}

    @endpoint
    async def train(self, steps: int, board: Board) -> list[Step]:
        log = []
        for version in range(1, steps + 1):
            start = time.monotonic()
            loss = nn.functional.mse_loss(self.model(self.x), self.y)
            self.opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            self.opt.step()
            trained, cpu = time.monotonic(), time.thread_time()
            # One copy into staging, then a small message; neither waits for a reader.
            manifest = self.publisher.publish(self.model.state_dict(), version)
            board.post.broadcast(manifest)
            staged, cpu = time.monotonic(), time.thread_time() - cpu
            # Not part of weight sync: a copy of every version, fingerprinted after the run,
            # so that the check below costs the timed loop one copy and no hashing.
            self.history[version] = {k: v.clone() for k, v in self.model.state_dict().items()}
            log.append(Step(version, start, trained, staged, time.monotonic(), cpu, loss.item()))
        return log

    @endpoint
    async def fingerprints(self) -> dict[int, str]:
        """The fingerprint of every version published so far."""
        return {version: fingerprint(state) for version, state in self.history.items()}

    @endpoint
    async def close(self) -> None:
        self.publisher.close()


class Generator(Actor):
    """Samples in a loop; between batches, pulls the newest version if there is one.

    It only runs forward passes, so its weights may be mapped: a mapped weight is read-only,
    and writing to it (an optimizer step, `load_state_dict`, any in-place op) would kill this
    process with SIGSEGV. A generator that modifies its weights uses `mode="copy"`, or calls
    `self.weights.unmap()` first.
    """

    def __init__(self, mode: SyncMode) -> None:
        torch.set_num_threads(1)
        self.model = make_model(seed=99)  # different weights until the first pull
        self.weights = Subscriber(self.model, mode=mode)  # knows the version the model holds
        self.prompts = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(2))

    @endpoint
    async def held(self) -> int:
        """The version this generator's weights hold (0: its own random init)."""
        return self.weights.version or 0

    @endpoint
    async def run(self, board: Board, last_version: int) -> tuple[list[Pull], list[Batch]]:
        pulls, batches = [], []
        version = 0
        while version < last_version:
            manifest = await board.newest.call_one()  # small, whatever the tensors' sizes
            if manifest is not None and manifest.version > version:
                # Not part of weight sync: what it sampled with, to check it never changed.
                sampled_with = fingerprint(self.model.state_dict())
                start, cpu = time.monotonic(), time.thread_time()
                got = await self.weights.pull(manifest)
                end, cpu = time.monotonic(), time.thread_time() - cpu
                pulls.append(
                    Pull(
                        start,
                        end,
                        version,
                        got.version,  # the newest complete version, maybe newer than asked
                        got.nbytes,
                        got.transport.value,
                        got.mapped,
                        cpu,
                        got.retries,
                        sampled_with,
                        fingerprint(self.model.state_dict()),
                    )
                )
                version = got.version
            start = time.monotonic()
            with torch.no_grad():  # "sampling": forward passes with the weights it holds
                for _ in range(6):
                    self.model(self.prompts)
            batches.append(Batch(start, time.monotonic(), version))
        return pulls, batches

    @endpoint
    async def after_close(self, manifest: Manifest) -> AfterClose:
        """Once the publisher is closed: are the weights intact, what does a pull say?"""
        mapped, held = self.weights.mapped, fingerprint(self.model.state_dict())
        error = ""
        try:
            await self.weights.pull(manifest, timeout=10.0)
        except RdmaTensorError as e:
            error = type(e).__name__
        self.weights.unmap()  # lets the closed publisher's memory go; same values
        return AfterClose(mapped, held, error, fingerprint(self.model.state_dict()))


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def lanes(steps: list[Step], pulls: list[Pull], batches: list[Batch], t0: float) -> None:
    """Both processes on one time axis, one character per time bucket."""
    end = max(steps[-1].end, batches[-1].end)
    width = 96
    dt = (end - t0) / width
    trainer, generator = [" "] * width, [" "] * width

    def paint(lane: list[str], a: float, b: float, mark: str) -> None:
        for i in range(int((a - t0) / dt), min(width, int((b - t0) / dt) + 1)):
            lane[i] = mark

    for s in steps:
        paint(trainer, s.start, s.trained, "T")
    for s in steps:
        paint(trainer, s.trained, s.end, "c")
    for b in batches:
        paint(generator, b.start, b.end, "g")
    for p in pulls:
        paint(generator, p.start, p.end, "P")
    print(f"\n{dt * 1e3:.0f} ms per character:")
    print("  trainer   |" + "".join(trainer) + "|")
    print("  generator |" + "".join(generator) + "|")
    print("  T train   c publish: copy into staging, post the manifest (+ the demo's own copy)")
    print("  g sample  P pull: map or copy (a mark fills its character even when shorter)")


def timeline(steps: list[Step], pulls: list[Pull], batches: list[Batch], t0: float) -> None:
    events: list[tuple[float, str, str]] = []
    for s in steps:
        events.append((s.start, f"step {s.version} starts", ""))
        staged = f"step {s.version} done, v{s.version} staged ({ms(s.staged - s.trained)})"
        events.append((s.trained, staged, ""))
    for p in pulls:
        events.append((p.start, "", f"pull starts (holds v{p.before})"))
        how = "mapped" if p.mapped else "copied"
        done = (
            f"pull done: holds v{p.version}, {how} ({p.nbytes / 1e6:.1f} MB, {ms(p.end - p.start)})"
        )
        events.append((p.end, "", done))
    first_batch = {b.version: b for b in reversed(batches)}
    for version, b in first_batch.items():
        events.append((b.start, "", f"samples with v{version}"))
    print(f"\n{'time':>8}  {'trainer':<40} generator")
    for at, left, right in sorted(events):
        print(f"{at - t0:7.3f}s  {left:<40} {right}")


def summary(steps: list[Step], pulls: list[Pull], manifest: Manifest) -> None:
    train = statistics.median(s.trained - s.start for s in steps)
    later = steps[1:]  # the first publish also allocates the staging slots
    slowest = max(later, key=lambda s: s.staged - s.trained)
    print(f"\nmodel: {manifest.nbytes / 1e6:.1f} MB of weights in {len(manifest.names)} tensors")
    print(f"the manifest, as pickled into the message: {len(pickle.dumps(manifest)):,} bytes")
    print(f"trainer, {len(steps)} steps: a training step took {ms(train)} (median)")
    print(
        f"  publish: {ms(statistics.median(s.staged - s.trained for s in later))} median "
        f"({ms(statistics.median(s.publish_cpu for s in later))} of it on the CPU), slowest "
        f"{ms(slowest.staged - slowest.trained)} ({ms(slowest.publish_cpu)} on the CPU); the "
        f"first, which also allocates the staging slots: {ms(steps[0].staged - steps[0].trained)}"
    )
    mapped = sum(p.mapped for p in pulls)
    print(f"generator, {len(pulls)} pulls over {pulls[0].transport}, ", end="")
    print(f"{mapped} mapped and {len(pulls) - mapped} copied: ", end="")
    print(f"{ms(statistics.median(p.end - p.start for p in pulls))} median ", end="")
    print(f"({ms(statistics.median(p.cpu for p in pulls))} of it on the generator's thread)")
    print("versions the generator held: " + " -> ".join(f"v{p.version}" for p in pulls))
    inside = [p for p in pulls if any(s.start < p.start and p.end < s.end for s in steps)]
    print(f"pulls that started and ended inside one trainer step: {len(inside)} of {len(pulls)}")
    retried = sum(p.retries for p in pulls)
    if retried:
        print(f"RDMA reads retried because their slot was rewritten meanwhile: {retried}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument(
        "--transport", choices=["auto", "shm", "rdma"], default="auto", help="default: auto"
    )
    parser.add_argument(
        "--mode",
        choices=["auto", "map", "copy"],
        default="auto",
        help="the generator's Subscriber mode (default auto: map when it can, else copy)",
    )
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4")
    if args.mode == "map" and args.transport == "rdma":
        parser.error("--mode map needs shared memory: RDMA reads can only be copied")
    transport = None if args.transport == "auto" else Transport(args.transport)
    mode: SyncMode = args.mode

    trainer_procs = this_host().spawn_procs(per_host={"procs": 1}, name="trainer")
    generator_procs = this_host().spawn_procs(per_host={"procs": 1}, name="generator")
    try:
        board = this_proc().spawn("board", Board)
        trainer = trainer_procs.spawn("trainer", Trainer, transport)
        generator = generator_procs.spawn("generator", Generator, mode)
        # Wait until all three actors answer, so that both loops start together.
        await asyncio.gather(
            trainer.fingerprints.call_one(), generator.held.call_one(), board.newest.call_one()
        )

        # The whole run: two independent loops. Neither calls the other.
        steps, (pulls, batches) = await asyncio.gather(
            trainer.train.call_one(args.steps, board),
            generator.run.call_one(board, args.steps),
        )
        published = await trainer.fingerprints.call_one()
        manifest = await board.newest.call_one()
        assert manifest is not None
        await trainer.close.call_one()
        after = await generator.after_close.call_one(manifest)
    finally:
        await generator_procs.stop()
        await trainer_procs.stop()

    t0 = steps[0].start
    lanes(steps, pulls, batches, t0)
    timeline(steps, pulls, batches, t0)

    summary(steps, pulls, manifest)

    last = steps[-1].end
    during = [p for p in pulls if p.end < last]
    expect(len(during) >= 2, f"{len(during)} pulls finished while the trainer kept training")
    expect(
        [s.version for s in steps] == list(range(1, args.steps + 1)),
        "the trainer ran every step back to back; its loop never waits on the generator",
    )
    expect(
        all(b.version > a.version for a, b in pairwise(pulls)),
        "the generator's version only moves forward",
    )
    expect(
        all(published[p.version] == p.fingerprint for p in pulls),
        "every version the generator pulled is bit-identical to what the trainer published "
        "(no torn mix of two versions)",
    )
    expect(
        pulls[-1].version == args.steps, f"the generator ended on the last version, v{args.steps}"
    )
    # auto maps wherever it can: the same machine (shared memory) and a CPU float32 model.
    maps = mode == "map" or (mode == "auto" and pulls[0].transport == Transport.SHM.value)
    expect(
        all(p.mapped == maps for p in pulls),
        f"every pull {'mapped the staging slot' if maps else 'copied'} (mode {mode}, "
        f"transport {pulls[0].transport})",
    )
    expect(
        all(b.held_fingerprint == a.fingerprint for a, b in pairwise(pulls)),
        "the weights the generator sampled with never changed between two of its pulls, "
        f"while the trainer staged {len(steps)} versions",
    )
    where = "on the closed publisher's memory, still mapped" if maps else "in its own memory"
    expect(
        after.mapped == maps and after.fingerprint == published[args.steps],
        f"after the trainer closed its publisher the generator still held v{args.steps} "
        f"bit for bit ({where})",
    )
    expect(
        after.pull_error == "PublisherClosedError",
        f"a pull after the close failed with {after.pull_error or 'no error'}",
    )
    expect(
        after.unmapped_fingerprint == published[args.steps],
        "unmap() moved the weights into the generator's own memory unchanged"
        if maps
        else "unmap() (nothing to move: the weights were copies) left them unchanged",
    )


if __name__ == "__main__":
    asyncio.run(main())
