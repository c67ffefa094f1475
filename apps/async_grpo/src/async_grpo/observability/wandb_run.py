"""A run mirrored to Weights & Biases (`--metrics.wandb PROJECT`): the config when it starts,
each step's row as `MetricsSink` writes it, and the HTML report (`observability/report`)
when it ends. W&B is an optional extra (`uv sync --extra wandb`) imported here only, when a
run asks for it; `missing` lets `launch.prepare` refuse such a run before anything starts.

The rows are plotted against their `version` (the train step), not W&B's own step counter:
a run rolled back to a checkpoint, or resumed from one, writes some versions again, and W&B
drops a step lower than one it has. A redone step shows as a second point at its version.
A resumed run continues the same W&B run: its id is kept in `<out_dir>/wandb-run-id`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from async_grpo.config.schema import ConfigError, RunConfig

RUN_ID_FILE = "wandb-run-id"


def missing() -> str | None:
    """Why W&B cannot be used here (None when it can): the package is not installed."""
    if importlib.util.find_spec("wandb") is None:
        return (
            "logging to W&B needs the `wandb` package, which is not installed: "
            "`uv sync --extra wandb` (or `pip install 'async-grpo[wandb]'`)"
        )
    return None


class WandbRun:
    """The W&B run of one training run, whose files are under `<out_dir>/wandb/`."""

    def __init__(self, cfg: RunConfig, out_dir: Path, *, resume: bool) -> None:
        """Starts (or, with `resume`, continues) the W&B run of `cfg.metrics.wandb`, with
        `cfg` as its config. A W&B that cannot start (online without an API key, say)
        raises `ConfigError` in one line."""
        import wandb  # noqa: PLC0415  (an optional extra)

        m = cfg.metrics
        id_file = out_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.exists() else ""
        try:
            self._run: Any = wandb.init(
                project=m.wandb,
                dir=str(out_dir),
                config=dataclasses.asdict(cfg),
                id=run_id or None,
                resume="allow",
                mode=None if m.wandb_mode == "auto" else m.wandb_mode,
            )
        except Exception as e:  # W&B's own errors (UsageError, CommError) share no base
            first = str(e).strip().splitlines()
            reason = first[0] if first else type(e).__name__
            raise ConfigError(f"metrics.wandb: W&B did not start: {reason}") from None
        self.id: str = self._run.id
        """The W&B run's id, kept in `<out_dir>/wandb-run-id` for a resumed run."""
        id_file.write_text(self.id)
        self._run.define_metric("version")
        self._run.define_metric("*", step_metric="version")
        self.dir = Path(self._run.dir).parent
        """This run's W&B directory (`<out_dir>/wandb/<offline-run|run>-<time>-<id>/`)."""

    def log(self, record: Mapping[str, object]) -> None:
        """One row: its numbers (a value not yet known, None, and text are left out)."""
        self._run.log(
            {
                key: value
                for key, value in record.items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            }
        )

    def finish(self, out_dir: Path, *, failed: bool) -> None:
        """Ends the W&B run; a run that did not fail first writes its report
        (`<out_dir>/report.html`, as `async-grpo report` does) and logs it as `report`."""
        if not failed:
            import wandb  # noqa: PLC0415

            # Imported here: plotly is loaded only by a run that reports to W&B.
            from async_grpo.observability.report.build import write_report  # noqa: PLC0415

            try:
                page = write_report(out_dir)
            except (OSError, ValueError) as e:  # ReportError is a ValueError
                print(f"[W&B: no report logged: {e}]", file=sys.stderr)
            else:
                self._run.log({"report": wandb.Html(page.read_text(encoding="utf-8"))})
        self._run.finish(exit_code=1 if failed else 0)
