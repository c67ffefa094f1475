"""Where a run's per-step records go: `<out_dir>/metrics.jsonl` (one `StepRow` a step),
`<out_dir>/trained_prompts.jsonl` (the prompts each step trained on), TensorBoard when
installed and W&B when asked for (`wandb_run.WandbRun`). A resumed or rolled-back run
rewinds both files to its checkpoint's copy."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from async_grpo.observability.metrics import StepRow
from async_grpo.observability.wandb_run import WandbRun

METRICS_FILE = "metrics.jsonl"
PROMPTS_FILE = "trained_prompts.jsonl"
"""One line per train step: its version and the prompt indices (= group ids) it trained on,
the audit that no prompt was trained twice (`benchmarks/chaos.py` reads it)."""


class MetricsSink:
    """Appends `StepRow`s to `<out_dir>/metrics.jsonl` and each step's prompts to
    `<out_dir>/trained_prompts.jsonl` (and the rows to TensorBoard when installed, and to
    `wandb` when given)."""

    def __init__(self, out_dir: Path, wandb: WandbRun | None = None) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir, self.wandb = out_dir, wandb
        self.path = out_dir / METRICS_FILE
        self.prompts_path = out_dir / PROMPTS_FILE
        self._file = self.path.open("w", encoding="utf-8")
        self._prompts = self.prompts_path.open("w", encoding="utf-8")
        self._tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

            self._tb = SummaryWriter(str(out_dir / "tensorboard"))
        except ImportError:
            self._tb = None

    def write(self, row: StepRow, prompts: Sequence[int] = ()) -> None:
        record = dataclasses.asdict(row)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._prompts.write(json.dumps({"version": row.version, "prompts": list(prompts)}) + "\n")
        self._prompts.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "version" and isinstance(value, int | float):
                    self._tb.add_scalar(key, value, row.version)
        if self.wandb is not None:
            self.wandb.log(record)

    def rewind(self, metrics: str, prompts: str) -> None:
        """Replaces both files' contents with a checkpoint's (the rows up to its version):
        a resumed or rolled-back run writes each version's row once."""
        for handle, text in ((self._file, metrics), (self._prompts, prompts)):
            handle.seek(0)
            handle.truncate()
            handle.write(text)
            handle.flush()

    def close(self, *, failed: bool = False) -> None:
        """Closes the files; ends the W&B run (`failed`: the run raised), with its report
        when it did not fail."""
        self._file.close()
        self._prompts.close()
        if self._tb is not None:
            self._tb.close()
        if self.wandb is not None:
            self.wandb.finish(self.out_dir, failed=failed)


def lines_up_to(path: Path, version: int) -> str:
    """The JSON lines of `path` whose "version" is at most `version`."""
    if not path.exists():
        return ""
    keep = [x for x in path.read_text().splitlines(True) if json.loads(x)["version"] <= version]
    return "".join(keep)
