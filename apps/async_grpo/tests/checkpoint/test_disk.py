"""A checkpoint on disk (pure, no Monarch): complete or absent, self-describing, refused
with the reason when damaged; the controller's state read back field for field; prompts by
index the same in every process."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.codec import CheckpointError
from async_grpo.config.schema import DataConfig
from async_grpo.controller import cut
from async_grpo.controller.cut import ControllerState
from async_grpo.controller.ledger import Call, Held, LedgerState
from async_grpo.observability.metrics import EvalScore, RunMetrics, Shown, StepRow
from async_grpo.seeds import derive_seed
from async_grpo.tasks.environments import TaskSourceState
from async_grpo.tasks.prompts import PromptStream, Sample
from rl_envs import Task


def written(out: Path, version: int, files: dict[str, bytes]) -> Path:
    partial = disk.begin(out, version)
    for name, data in files.items():
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        (partial / name).write_bytes(data)
    return disk.finish(partial, version, trainer_procs=2, holds=["a", "b"])


def test_a_checkpoint_is_complete_only_once_renamed(tmp_path: Path) -> None:
    partial = disk.begin(tmp_path, 5)
    (partial / "x").write_bytes(b"half")
    assert disk.complete(tmp_path) == []  # a write in progress is invisible
    final = written(tmp_path, 5, {"x": b"data", "trainer/r0": b"12345"})
    assert final.name == "step-000005"
    manifest = disk.verify(final)
    assert (manifest.version, manifest.trainer_procs, manifest.holds) == (5, 2, ("a", "b"))
    assert {(f.path, f.bytes) for f in manifest.files} == {("x", 4), ("trainer/r0", 5)}
    disk.remove_partials(tmp_path)
    assert not partial.exists()
    assert disk.complete(tmp_path) == [final]


def test_only_the_newest_are_kept(tmp_path: Path) -> None:
    for v in (2, 4, 6, 8):
        written(tmp_path, v, {"x": bytes([v])})
    removed = disk.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step-000002", "step-000004"]
    assert [p.name for p in disk.complete(tmp_path)] == ["step-000006", "step-000008"]


def test_damage_is_named(tmp_path: Path) -> None:
    final = written(tmp_path, 3, {"a.bin": b"abcdef", "b.bin": b"xyz"})
    with (final / "a.bin").open("r+b") as f:
        f.truncate(2)
    with pytest.raises(
        CheckpointError, match=r"a.bin has 2 bytes, the manifest says 6 \(truncated\)"
    ):
        disk.verify(final)
    (final / "a.bin").write_bytes(b"abcdeF")
    with pytest.raises(CheckpointError, match=r"a\.bin does not match the sha256.*corrupted"):
        disk.verify(final)
    (final / "a.bin").write_bytes(b"abcdef")
    (final / "b.bin").unlink()
    with pytest.raises(CheckpointError, match=r"b\.bin is missing"):
        disk.verify(final)
    (final / disk.MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a readable checkpoint manifest"):
        disk.verify(final)
    os.remove(final / disk.MANIFEST)
    with pytest.raises(CheckpointError, match=r"is incomplete: it has no manifest\.json"):
        disk.verify(final)
    assert disk.complete(tmp_path) == []


def test_another_format_is_refused(tmp_path: Path) -> None:
    final = written(tmp_path, 1, {"x": b"1"})
    raw = json.loads((final / disk.MANIFEST).read_text())
    raw["format_version"] = 99
    (final / disk.MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="format version 99"):
        disk.verify(final)


def full_state() -> ControllerState:
    """A controller state with every kind of field filled in."""
    metrics = RunMetrics(4)
    metrics.rewards.extend([0.5, 1.0])
    metrics.recent.append(Shown("count to 2:", "1 2", 1.0, 3))
    metrics.evals.append(EvalScore(4, 3, 0.5, 0.25, (("count to 1:", 0.5),)))
    metrics.faults.trainer_restores = 2
    metrics.reached_09 = (7, 12.5)
    row: dict[str, Any] = {f.name: 0 for f in dataclasses.fields(StepRow)}
    metrics.last_row = StepRow(
        **{**row, "loss": -0.25, "eval_reward": None, "weight_sync_transport": "rdma"}
    )
    task = Task("repeat", 5, "train", 1)
    call = Call((3, 4), derive_seed(0, "call", 3), 2, (task, task))
    ledger = LedgerState(9, (call,), (Held(call.only([4]), 1),), 2, 1)
    rng = (3, tuple(range(625)), None)
    tasks = TaskSourceState(rng, (("repeat", 4),), (("repeat", 1),))
    return ControllerState(7, ledger, metrics.snapshot(), tasks, 6)


def test_the_controller_state_reads_back_as_written() -> None:
    state = full_state()
    assert cut.parse(cut.encode(state)) == state


def test_a_malformed_controller_state_is_refused_naming_where() -> None:
    raw = json.loads(cut.encode(full_state()))
    raw["ledger"]["redo"][0]["seed"] = "seven"
    with pytest.raises(CheckpointError, match=r"controller.ledger.redo\[0\].seed: expected int"):
        cut.parse(json.dumps(raw))
    raw = json.loads(cut.encode(full_state()))
    raw["metrics"]["surprise"] = 1
    with pytest.raises(
        CheckpointError, match=r"controller.metrics: unknown field\(s\) \['surprise'\]"
    ):
        cut.parse(json.dumps(raw))


def test_prompt_i_is_the_same_wherever_it_is_asked_for() -> None:
    cfg = DataConfig(task="count", min_n=1, max_n=6)
    a, b = PromptStream(cfg, None, seed=3), PromptStream(cfg, None, seed=3)
    assert [a.at(i) for i in range(50)] == [b.at(i) for i in reversed(range(50))][::-1]
    assert [a.at(i) for i in range(50)] != [PromptStream(cfg, None, 4).at(i) for i in range(50)]
    # A dataset: every sample once per epoch, each epoch in its own order.
    samples = [Sample(f"p{i}", str(i)) for i in range(7)]
    stream = PromptStream(cfg, samples, seed=0)
    epochs = [[stream.at(e * 7 + k) for k in range(7)] for e in range(3)]
    assert all(sorted(x.prompt for x in ep) == sorted(s.prompt for s in samples) for ep in epochs)
    assert epochs[0] != epochs[1]
    assert PromptStream(cfg, samples, seed=0).at(15) == epochs[2][1]
