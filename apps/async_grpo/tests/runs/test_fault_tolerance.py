"""Any process may die and the run goes on, losing nothing: a sync run with a fixed seed
repeats bit for bit (per-step losses, rewards, the prompts trained, the final weights and
optimizer state) when its controller is SIGKILLed and the run resumed with `--resume`,
when its trainer is SIGKILLed (restored from the last checkpoint; here in the resumed run,
which spares a run of its own), and when its replay buffer is SIGKILLed while it holds
groups (they are generated again). A run resumes onto more trainer processes, and the
sharded checkpoint they write exports the whole weights it holds.

Real Monarch processes, real kills by pid; a small model (`conftest.TEST_ARCH`), 6 steps
with a checkpoint every 2.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.export import export
from async_grpo.checkpoint.trainer_state import load_trainer_state
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import RunConfig
from async_grpo.controller import cut, rollout
from async_grpo.controller.ledger import Call
from async_grpo.grpo.step import TrainerCore
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components
from async_grpo.model.policy import load_policy
from async_grpo.train import run
from exact_runs import (
    KILL_AT,
    STEPS,
    assert_same_state,
    assert_trainer_restored,
    final_state,
    kill_at_step,
    resume_killing_the_trainer,
    run_left_alone,
    sync_options,
    trained,
)
from jobs import keeping, rows, unaccounted
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


def config(out: Path, model: Path) -> RunConfig:
    return apply_overrides(tiny(), sync_options(out, model))


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    """The run left alone."""
    return run_left_alone(tmp_path_factory, "clean", sync_options(Path(), tiny_checkpoint))


def test_a_sigkilled_run_resumes_exactly_and_so_does_its_killed_trainer(
    clean: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # Two failures, each repeated bit for bit: the whole run SIGKILLed at step 5, then, in the
    # run resumed from its newest checkpoint, the trainer aborted (SIGABRT, as a native
    # library's failed check ends a process) when step 5 is recorded again (restored from
    # the newest checkpoint then).
    kill_at_step(sync_options(tmp_path, tiny_checkpoint), tmp_path, KILL_AT)
    assert len(rows(tmp_path)) == KILL_AT  # step 5 was recorded, then everything was lost
    lines: list[str] = []
    resume_killing_the_trainer(tmp_path, KILL_AT, lines, signal.SIGABRT)
    assert_trainer_restored(lines, tmp_path, KILL_AT)
    # Its death line says where it was, from the stacks it wrote as it died.
    (died,) = [x for x in lines if x.startswith("[trainer died:")]
    assert " crashed in " in died, died
    assert "(Fatal Python error: Aborted), stacks in " in died, died
    stacks = Path(died.split("stacks in ")[1].split(";")[0])
    assert stacks.parent == tmp_path / "crashes"
    assert "(most recent call first)" in stacks.read_text()
    assert rows(tmp_path)[-1]["resumes"] == 1
    assert [unaccounted(r) for r in rows(tmp_path)] == [0] * STEPS  # rolled back: lost
    assert trained(tmp_path) == trained(clean)
    assert_same_state(final_state(tmp_path), final_state(clean))


def test_an_async_run_resumed_skips_no_prompt_and_trains_none_twice(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # No staleness bound to speak of: every prompt drawn is then trained, held or queued, so
    # a prompt the interruption skipped would show as a gap.
    opts = {
        **sync_options(tmp_path, tiny_checkpoint),
        "mode": "async",
        "buffer.max_policy_age": "100",
    }
    kill_at_step(opts, tmp_path, KILL_AT)
    assert main(["--resume", "--out_dir", str(tmp_path)]) == 0
    assert [r["version"] for r in rows(tmp_path)] == list(range(1, STEPS + 1))
    lines = (tmp_path / "trained_prompts.jsonl").read_text().splitlines()
    trained_ids = [i for line in lines for i in json.loads(line)["prompts"]]
    assert len(trained_ids) == len(set(trained_ids)), "a prompt was trained twice"
    last = tmp_path / "checkpoints" / f"step-{STEPS:06d}" / "controller.json"
    ledger = cut.parse(last.read_text()).ledger
    waiting = [i for c in ledger.redo for i in c.indices]
    waiting += [i for h in ledger.held for i in h.call.indices]
    assert not set(trained_ids) & set(waiting)
    assert sorted(trained_ids + waiting) == list(range(ledger.next_index)), "a prompt was skipped"


def test_a_killed_buffer_loses_only_what_it_held(
    clean: Path, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, tiny_checkpoint)
    started: list[Components] = []
    put = rollout.put_episodes
    arrived: list[Call] = []
    first: list[Call] = []
    both, dead, redrawn = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def put_then_kill(job: Any, call: Call, *args: Any, **kwargs: Any) -> int:
        # Batch 3 is two calls. The later prompts' groups reach the buffer alone (the
        # other call's wait until they are drawn again), so it cannot have handed batch 3
        # to the trainer yet and holds exactly those groups when it is killed. Their
        # bookkeeping waits for the earlier call's and must survive their redrawing.
        if call.recorded:  # batch 3's later prompts, drawn again
            try:
                return await put(job, call, *args, **kwargs)
            finally:
                redrawn.set()
        if call.version != 3 or dead.is_set():
            return await put(job, call, *args, **kwargs)
        arrived.append(call)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        if call is not max(arrived, key=lambda c: c.indices[0]):
            await redrawn.wait()
            return await put(job, call, *args, **kwargs)
        first.append(call)
        try:
            done = await put(job, call, *args, **kwargs)
            (pid,) = started[0].buffer.status().replicas[0].pids
            os.kill(pid, signal.SIGKILL)
            return done
        finally:
            dead.set()

    monkeypatch.setattr(rollout, "put_episodes", put_then_kill)
    lines: list[str] = []
    asyncio.run(run(cfg, prepare(cfg), quiet=True, log=lines.append, spawn=keeping(started)))
    died = [x for x in lines if x.startswith("[buffer replica 0 died:")]
    assert len(died) == 1, lines
    assert f"the {len(first[0].indices)} groups it held are generated again" in died[0], died
    assert any(x.startswith("[buffer replica 0 is back after") for x in lines), lines
    last = rows(tmp_path)[-1]
    assert (last["replica_deaths"], last["replica_restarts"]) == (1, 1)
    assert last["episodes_lost"] >= cfg.sampling.group_size  # at least the group held
    assert [unaccounted(r) for r in rows(tmp_path)] == [0] * STEPS
    assert trained(tmp_path) == trained(clean)  # regenerated, the same episodes
    assert_same_state(final_state(tmp_path), final_state(clean))


@pytest.fixture(scope="module")
def on_two(clean: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run left alone, resumed for two more steps onto a 2-process trainer (every
    parameter a `Shard(0)` DTensor, each rank writing its shards of step 8's checkpoint)."""
    out = tmp_path_factory.mktemp("on-two")
    shutil.copytree(clean, out, dirs_exist_ok=True)
    args = ["--resume", "--out_dir", str(out), "--steps", str(STEPS + 2)]
    assert main([*args, "--trainer.procs", "2"]) == 0
    return out


def test_a_run_resumes_onto_more_trainer_processes(clean: Path, on_two: Path) -> None:
    # The trainer's state is a distributed checkpoint: written by one process, loaded by two.
    resumed = rows(on_two)
    assert [r["version"] for r in resumed] == list(range(1, STEPS + 3))
    assert resumed[:STEPS] == rows(clean)
    assert resumed[-1]["resumes"] == 1
    assert all(math.isfinite(r["loss"]) for r in resumed[STEPS:])


def test_a_sharded_checkpoint_exports_the_weights_it_holds(
    on_two: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # The weights it holds are read back independently of the export's loader: by
    # `torch.distributed.checkpoint`'s own consolidation (`dcp_to_torch_save`), and by a
    # one-process trainer loading it the way a resumed run does.
    checkpoint = disk.complete(on_two)[-1]
    assert disk.read_manifest(checkpoint).trainer_procs == 2
    policy = export(on_two, tmp_path / "exported")
    assert policy.version == STEPS + 2
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()

    dcp_to_torch_save(checkpoint / disk.TRAINER_DIR, tmp_path / "whole.pt")
    held = torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    assert set(held) <= set(exported)
    for name, tensor in held.items():
        assert torch.equal(exported[name], tensor), name
    # Tied weights the checkpoint holds once are the same tensor in the export.
    for name in set(exported) - set(held):
        assert any(torch.equal(exported[name], t) for t in held.values()), name

    cfg = config(on_two, tiny_checkpoint)
    model = load_policy(policy.base)
    vocab = int(model.config.vocab_size)
    core = TrainerCore(model, cfg.trainer, cfg.sampling, vocab_size=vocab, pad_id=0, total_steps=9)
    load_trainer_state(core, checkpoint / disk.TRAINER_DIR, sharded=False)
    assert core.version == STEPS + 2
    restored = core.model.state_dict()
    assert all(torch.equal(exported[n], restored[n]) for n in restored)
    base = load_policy(policy.base).state_dict()
    assert any(not torch.equal(exported[n], base[n]) for n in base)  # it trained
