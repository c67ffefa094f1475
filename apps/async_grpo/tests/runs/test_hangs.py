"""A process that hangs while its host still answers for it (a deadlocked endpoint, a
collective that never completes) is found by its deadline, shown (its stack saved, one line
naming it, the call and the innermost frame of the project's code) and replaced, and the run
goes on: the trainer restored from its newest checkpoint, a generator replica restarted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from async_grpo.actors._test_hang import HANG_ENV
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.train import run

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


@pytest.mark.timeout(420)
def test_a_hung_trainer_and_a_hung_generator_are_shown_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_checkpoint: Path
) -> None:
    out = tmp_path / "run"
    monkeypatch.setenv(
        HANG_ENV,
        f"generator.generate:6:{tmp_path / 'hung-generator'},"
        f"trainer.train_step:4:{tmp_path / 'hung-trainer'}",
    )
    cfg = apply_overrides(
        tiny(),
        {
            "model.path": str(tiny_checkpoint),
            "steps": "6",
            "checkpoint.every": "2",
            "eval_every": "0",
            "out_dir": str(out),
            "trainer.step_timeout_s": "15",
            "generator.call_timeout_s": "15",
        },
    )
    lines: list[str] = []
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True, log=lines.append))

    assert (tmp_path / "hung-generator").exists()  # both hooks fired
    assert (tmp_path / "hung-trainer").exists()
    assert summary.steps == 6  # and the run went on to its end
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["trainer_restores"] == 1
    assert rows[-1]["replica_deaths"] >= 1

    stuck = [x for x in lines if " stuck: " in x]
    trainer = next(x for x in stuck if x.startswith("[trainer stuck:"))
    generator = next(x for x in stuck if x.startswith("[generator replica 0 stuck:"))
    assert "no answer to `train_step` within 15 s" in trainer, trainer
    assert "no answer to `generate` within 15 s" in generator, generator
    for line in (trainer, generator):
        # The innermost frame of the project's code: the hook that blocks.
        assert "at _hang_for_a_test (async_grpo/actors/_test_hang.py:" in line, line
        saved = Path(line.split("stack saved to ")[1].rstrip("]"))
        assert saved.parent == out / "stuck"
        assert "_hang_for_a_test" in saved.read_text()
    # Restored from step 2's checkpoint: the trainer wrote its part before it hung, so the
    # checkpoint is completed from the files even where the trainer's confirmation (`saved`)
    # waited behind the hung call, as it can on a loaded machine; the log names the source
    # and the version it is back at.
    died = [
        x for x in lines if x.startswith("[trainer died: no answer to `train_step` within 15 s")
    ]
    assert len(died) == 1, lines
    assert "restoring it from step-000002]" in died[0], died
    assert any(x.startswith("[trainer is back at version 2 after") for x in lines), lines
