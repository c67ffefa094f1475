"""Taking the run's checkpoints: one consistent cut across the controller, the replay
buffer and the trainer, written in the background.

The cut is taken between two train steps, with no batch on its way from the buffer (the
step before a checkpoint does not ask for the next batch early):

1. the prompt ledger is frozen: no rollout starts a new call;
2. one message to the buffer returns its state and the groups it holds, and the
   controller's state (ledger, metrics, task draws) is taken in memory as that answer
   arrives, before any later put is booked: a call still in flight, or put after the
   snapshot, is drawn again after a resume, so no prompt is skipped or trained twice;
3. at the same time, the trainer hands its state to DCP (`trainer_state.CheckpointWriter`:
   the copy runs in the background, and only its next optimizer update waits for it);
4. once both have answered, the ledger thaws.

The training loop is held for these four (`checkpoint_s` in the metrics). The rest runs
in the background while training goes on: the trainer's ranks write their distributed
checkpoint, the controller writes the config, its state, the buffer's and the metrics rows
up to the cut, then the manifest and the rename that makes the checkpoint complete
(`disk.finish`), then deletes the oldest beyond `--checkpoint.keep`.

The controller's files wait for the trainer's own write, which the trainer confirms
(`saved`). A trainer that hangs or dies after its write finished cannot confirm it, so the
files are read too: DCP's metadata on disk means the trainer's part is complete, and such a
checkpoint is completed and restored from rather than dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from replay_buffer import BufferSnapshot

from async_grpo.actors.buffer import BufferActor
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.disk import TRAINER_DIR
from async_grpo.config.schema import RunConfig
from async_grpo.controller.cut import HOLDS, ControllerState, write_files
from async_grpo.controller.ledger import LedgerState, PromptLedger
from async_grpo.controller.staleness import StalenessGate
from async_grpo.launch.spawn import Components
from async_grpo.observability.sink import MetricsSink, rows_up_to


class CutSource(Protocol):
    """What a cut is taken from (the controller's `Job`): the processes, the prompt ledger,
    the staleness gate, the metrics files, and the controller's state with a given ledger
    state."""

    components: Components
    ledger: PromptLedger
    gate: StalenessGate
    sink: MetricsSink

    def controller_state(self, version: int, ledger: LedgerState) -> ControllerState: ...


TRAINER_FILES_POLL_S = 0.5
"""How often a checkpoint's writer looks for the trainer's finished files while it waits for
the trainer to confirm them (`Checkpoints._trainer_wrote`)."""


class Checkpoints:
    """The run's checkpoints: `take` one at a cut, written in the background; `newest` is
    the newest complete one of this run (what a trainer that dies is restored from)."""

    def __init__(self, cfg: RunConfig, newest: Path | None, log: Callable[[str], None]) -> None:
        self._cfg, self._out = cfg, Path(cfg.out_dir)
        self.newest = newest
        self.taken: int | None = None  # the version of the last one taken
        self._log = log
        self._writing: asyncio.Task[None] | None = None
        self._partial: Path | None = None

    def due(self, version: int) -> bool:
        """A checkpoint is taken after the step that makes `version`."""
        return version % self._cfg.checkpoint.every == 0 and version != self.taken

    async def take(self, job: CutSource, version: int) -> float:
        """Takes the cut at `version` and starts writing it; returns the seconds training
        was held."""
        begin = time.perf_counter()
        if self._writing is not None:
            await self._writing  # one at a time: the last one's files are still being written
        self._partial = disk.begin(self._out, version)
        job.ledger.frozen = True
        try:

            async def buffer_and_controller() -> tuple[BufferSnapshot, ControllerState]:
                snap = await job.components.buffer.endpoint(BufferActor.snapshot).route()
                # The controller's state as the snapshot answers, not after the trainer's
                # save: a put the buffer takes meanwhile must still be in flight here.
                # Group ids are prompt indices here (`ledger.py`).
                held = {int(group): oldest for group, oldest in snap.groups}
                return snap, job.controller_state(version, job.ledger.state(held))

            # The buffer's state and the trainer's at the same cut, both at once.
            (snap, state), _ = await asyncio.gather(
                buffer_and_controller(), job.components.trainer.save(self._partial / TRAINER_DIR)
            )
        finally:
            job.ledger.frozen = False
            await job.gate.notify()
        self.taken = version
        self._writing = asyncio.create_task(self._write(job, self._partial, state, snap.state))
        return time.perf_counter() - begin

    @property
    def writing(self) -> bool:
        """A checkpoint taken is still being written (not complete yet)."""
        return self._writing is not None and not self._writing.done()

    async def finish(self) -> None:
        """Returns once the checkpoint being written (if any) is complete or has failed."""
        if self._writing is not None:
            await self._writing

    async def abandon(self) -> None:
        """The trainer died. The checkpoint being written is completed where the trainer's
        part of it is already on disk (nothing more is needed from the trainer) and dropped
        otherwise: it would never become complete."""
        writing, partial = self._writing, self._partial
        on_disk = partial is not None and await asyncio.to_thread(disk.trainer_written, partial)
        if writing and not writing.done() and on_disk:
            with contextlib.suppress(Exception):  # `_write` says why it failed
                await writing
            self._writing = None
            if self._partial is not None:  # failed after all: like a dropped one
                self.taken = None
            return
        if partial is None:  # none taken, or the last one complete: nothing to drop
            self._writing = None
            return
        if self._writing is not None:
            self._writing.cancel()
            with contextlib.suppress(BaseException):
                await self._writing
        # Cancelled before it began (`_write` removed nothing), or failed (it did).
        await asyncio.to_thread(shutil.rmtree, partial, ignore_errors=True)
        self._writing = None
        self._partial = None
        self.taken = None

    async def _write(
        self, job: CutSource, partial: Path, state: ControllerState, buffer: dict[str, Any]
    ) -> None:
        version = state.version
        try:
            start = time.perf_counter()
            await self._trainer_wrote(job, partial)
            sink = job.sink
            metrics_end, prompts_end = sink.ends_at(version)
            await asyncio.to_thread(
                lambda: write_files(
                    partial,
                    self._cfg,
                    state,
                    buffer,
                    metrics_rows=rows_up_to(sink.path, metrics_end),
                    prompt_rows=rows_up_to(sink.prompts_path, prompts_end),
                )
            )
            final = await asyncio.to_thread(
                disk.finish, partial, version, self._cfg.trainer.procs, HOLDS
            )
        except BaseException as e:
            shutil.rmtree(partial, ignore_errors=True)
            if not isinstance(e, Exception):
                raise  # cancelled: abandoned
            self._log(f"[checkpoint {disk.step_name(version)} not written: {e}]")
            return
        self.newest = final
        self._partial = None
        disk.prune(self._out, self._cfg.checkpoint.keep)
        size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
        self._log(
            f"[checkpoint {final.name}: {size / 2**20:.1f} MiB, written in "
            f"{time.perf_counter() - start:.1f}s in the background]"
        )

    async def _trainer_wrote(self, job: CutSource, partial: Path) -> None:
        """Returns once the trainer's part of the checkpoint in `partial` is written: the
        trainer says so (`saved`, which raises what the write raised), or, where it cannot
        (hung, or dead after its write finished), DCP's metadata is on disk."""
        said = asyncio.ensure_future(job.components.trainer.saved())
        try:
            while True:
                await asyncio.wait({said}, timeout=TRAINER_FILES_POLL_S)
                if said.done() and said.exception() is None:
                    return
                if await asyncio.to_thread(disk.trainer_written, partial):
                    return
                if said.done():
                    said.result()  # the write failed, or the trainer died before it ended
        finally:
            said.cancel()
