"""What the controller's loops share during one job (`Job`), and how a job is asked to stop
(`StopRequest`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from async_grpo.config.schema import RunConfig
from async_grpo.controller.broadcast import WeightBroadcast
from async_grpo.controller.checkpoints import Checkpoints
from async_grpo.controller.cut import ControllerState, Cut
from async_grpo.controller.evaluation import Evaluator
from async_grpo.controller.ledger import LedgerState, PromptLedger
from async_grpo.controller.staleness import StalenessGate
from async_grpo.launch.prepare import Prepared
from async_grpo.launch.spawn import Components
from async_grpo.observability.metrics import RunMetrics
from async_grpo.observability.sink import MetricsSink
from async_grpo.tasks.environments import TaskSource


@dataclasses.dataclass
class StopRequest:
    """Ctrl-C or SIGTERM as the job sees it: the training loop ends after its current step,
    a checkpoint is written, every process is stopped. `signal` is the one received,
    `sender` who sent it ("pid 1234 (its command line)", `launch.signals.Sender`; None when
    not known)."""

    signal: int | None = None
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    sender: str | None = None

    def request(self, signum: int, sender: str | None = None) -> None:
        self.signal = signum
        self.sender = sender
        self.event.set()


@dataclasses.dataclass
class Job:
    """One job's shared state: its components (the processes' handles), the prompt ledger,
    the staleness gate, metrics, the weights on their way to the generators, checkpoints,
    and `base`, the cut it started from (a rollback's target until the first checkpoint is
    written)."""

    cfg: RunConfig
    prep: Prepared
    components: Components
    ledger: PromptLedger
    gate: StalenessGate
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
