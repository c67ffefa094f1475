"""What the controller's loops share during one run (`Run`), and how a run is asked to stop
(`StopRequest`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from async_grpo.broadcast import WeightBroadcast
from async_grpo.checkpointing import Checkpoints
from async_grpo.components import Components
from async_grpo.config import RunConfig
from async_grpo.environments import TaskSource
from async_grpo.evaluation import Evaluator
from async_grpo.ledger import LedgerState, PromptLedger
from async_grpo.metrics import RunMetrics
from async_grpo.metrics_sink import MetricsSink
from async_grpo.prepare import Prepared
from async_grpo.resume import Cut
from async_grpo.run_state import ControllerState
from async_grpo.versions import Versions


@dataclasses.dataclass
class StopRequest:
    """Ctrl-C or SIGTERM as the run sees it: the training loop ends after its current step,
    a checkpoint is written, every process is stopped. `signal` is the one received."""

    signal: int | None = None
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def request(self, signum: int) -> None:
        self.signal = signum
        self.event.set()


@dataclasses.dataclass
class Run:
    """One run's shared state: its components, the prompt ledger, versions, metrics, the
    weights on their way to the generators, checkpoints, and `base`, the cut it started
    from (a rollback's target until the first checkpoint is written)."""

    cfg: RunConfig
    prep: Prepared
    c: Components
    ledger: PromptLedger
    versions: Versions
    metrics: RunMetrics
    weights: WeightBroadcast
    sink: MetricsSink
    checkpoints: Checkpoints
    evaluator: Evaluator
    tasks: TaskSource | None
    base: Cut
    stop: StopRequest
    log: Callable[[str], None]

    def controller_state(self, version: int, ledger: LedgerState) -> ControllerState:
        """The controller now, with `ledger` (the ledger's state at the cut)."""
        return ControllerState(
            version=version,
            ledger=ledger,
            metrics=self.metrics.snapshot(),
            tasks=self.tasks.state() if self.tasks is not None else None,
            pending_eval=self.evaluator.pending,
        )
