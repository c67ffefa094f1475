"""Where a run's per-step records go: `<out_dir>/metrics.jsonl` (one `StepRow` a step),
`<out_dir>/trained_prompts.jsonl` (the prompts each step trained on), TensorBoard when
installed and W&B when asked for (`wandb_run.WandbRun`). A resumed or rolled-back run
rewinds both files to its checkpoint's copy."""

from __future__ import annotations

import bisect
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
        # Each row's version and where it ends in each file, in writing order: a checkpoint
        # copies the files up to its version without reading every row back.
        self._ends: list[tuple[int, int, int]] = []
        self._tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

            self._tb = SummaryWriter(str(out_dir / "tensorboard"))
        except ImportError:
            self._tb = None

    def write(self, row: StepRow, prompts: Sequence[int] = ()) -> None:
        if self._ends and row.version <= self._ends[-1][0]:
            raise ValueError(
                f"metrics row for version {row.version} after version {self._ends[-1][0]}: "
                "rows are written once per version, in order (a rollback rewinds first)"
            )
        record = dataclasses.asdict(row)
        line = json.dumps(record) + "\n"
        prompt_line = json.dumps({"version": row.version, "prompts": list(prompts)}) + "\n"
        self._file.write(line)
        self._file.flush()
        self._prompts.write(prompt_line)
        self._prompts.flush()
        _, metrics_end, prompts_end = self._ends[-1] if self._ends else (0, 0, 0)
        # json.dumps escapes every non-ASCII character: a line's length is its size in bytes.
        self._ends.append((row.version, metrics_end + len(line), prompts_end + len(prompt_line)))
        if self._tb is not None:
            for key, value in record.items():
                if key != "version" and isinstance(value, int | float):
                    self._tb.add_scalar(key, value, row.version)
        if self.wandb is not None:
            self.wandb.log(record)

    def rewind(self, metrics: str, prompts: str) -> None:
        """Replaces both files' contents with a checkpoint's (the rows up to its version):
        a resumed or rolled-back run writes each version's row once."""
        ends = _row_ends(metrics, prompts)  # first: rows that do not pair up change nothing
        for handle, text in ((self._file, metrics), (self._prompts, prompts)):
            handle.seek(0)
            handle.truncate()
            handle.write(text)
            handle.flush()
        self._ends = ends

    def ends_at(self, version: int) -> tuple[int, int]:
        """The bytes of `metrics.jsonl` and of `trained_prompts.jsonl` that hold the rows up
        to `version` (rows are written in version order); `rows_up_to` reads them."""
        at = bisect.bisect_right(self._ends, version, key=lambda end: end[0])
        return (self._ends[at - 1][1], self._ends[at - 1][2]) if at else (0, 0)

    def close(self, *, failed: bool = False) -> None:
        """Closes the files; ends the W&B run (`failed`: the run raised), with its report
        when it did not fail."""
        self._file.close()
        self._prompts.close()
        if self._tb is not None:
            self._tb.close()
        if self.wandb is not None:
            self.wandb.finish(self.out_dir, failed=failed)


def rows_up_to(path: Path, end: int) -> str:
    """The first `end` bytes of `path` (whole rows: `MetricsSink.ends_at`), "" without it.
    Runs in a thread: the file can be large in a long run."""
    if end == 0 or not path.exists():
        return ""
    with path.open("rb") as f:
        return f.read(end).decode("utf-8")


def _row_ends(metrics: str, prompts: str) -> list[tuple[int, int, int]]:
    """`MetricsSink._ends` of files holding `metrics` and `prompts` (a checkpoint's copies,
    one line per version in both, in the same order); ValueError naming the first row that
    is not one: a line without a JSON "version", two rows of another version, a version not
    after the one before."""
    metric_lines = metrics.splitlines(True)
    prompt_lines = prompts.splitlines(True)
    if len(metric_lines) != len(prompt_lines):
        raise ValueError(
            f"a checkpoint's metrics rows ({len(metric_lines)}) and prompt rows "
            f"({len(prompt_lines)}) differ in number"
        )
    ends: list[tuple[int, int, int]] = []
    metrics_end = prompts_end = 0
    for i, (m, p) in enumerate(zip(metric_lines, prompt_lines, strict=True), 1):
        version, prompts_version = _version_of(m, "metrics", i), _version_of(p, "prompt", i)
        if version != prompts_version:
            raise ValueError(
                f"a checkpoint's metrics row {i} is of version {version}, its prompt row "
                f"{i} of version {prompts_version}"
            )
        if ends and version <= ends[-1][0]:
            raise ValueError(
                f"a checkpoint's row {i} is of version {version}, after version {ends[-1][0]}"
            )
        metrics_end += len(m.encode("utf-8"))
        prompts_end += len(p.encode("utf-8"))
        ends.append((version, metrics_end, prompts_end))
    return ends


def _version_of(line: str, which: str, i: int) -> int:
    try:
        version = json.loads(line)["version"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            f"a checkpoint's {which} row {i} is not a JSON row with a version"
        ) from None
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"a checkpoint's {which} row {i} has version {version!r}")
    return version
