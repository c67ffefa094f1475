"""The sharded trainer (`trainer.procs > 1`): FSDP over gloo in a Monarch process mesh, weights
to an unsharded generator through dtensor-reshard, its checkpoint loaded by one process.

Real processes: a 2-rank trainer mesh (every parameter a `Shard(0)` DTensor), a one-process
trainer fed the same batches, one generator replica, the replay buffer, dataset and reward
actors, all driven by the loop's own functions (`rollout_prompts`, `sync_weights`). And a whole
run whose 2-rank trainer loses a rank to SIGABRT, restored from its checkpoint.
"""

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch
from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.generator import Generator
from async_grpo.actors.trainer import TrainResult
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import RunConfig
from async_grpo.controller.broadcast import sync_weights
from async_grpo.controller.ledger import PromptLedger
from async_grpo.controller.rollout import rollout_prompts
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components, shutdown, spawn_components
from async_grpo.launch.trainer import TrainerMesh, spawn_trainer
from async_grpo.observability.metrics import RunMetrics, StepRow
from async_grpo.train import run
from dtensor_reshard import ShardedManifest
from exact_runs import KILL_AT, assert_trainer_restored
from jobs import Parts, keeping
from rdma_tensor import Manifest

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)

STEPS = 3


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


async def generator_weights(c: Components) -> tuple[int, dict[str, torch.Tensor]]:
    version, weights = await c.generator.endpoint(Generator.weights).route()
    return version, weights


async def run_steps(c: Components, cfg: RunConfig, single: TrainerMesh) -> list[float]:
    """STEPS train steps on both trainers with the same batches; after each, a weight sync
    from the sharded one and a bit-for-bit check of the generator against `full_tensor()`.
    Returns the largest difference between the two trainers' weights after each step."""
    ledger = PromptLedger(cfg.seed, cfg.generator.prompts_per_call, None)
    diffs = []
    for version in range(STEPS):
        batch = None
        while batch is None:
            call = ledger.claim(version)
            assert call is not None
            await rollout_prompts(Parts(cfg, c, ledger, RunMetrics(cfg.window)), call)
            batch = await c.buffer.endpoint(BufferActor.sample).route(
                version, cfg.trainer.batch_size
            )
        # Five copies of each group's first episode, as a policy that has learned its answer
        # repeats it: each rank merges the copies among its own rows (`merge_identical`).
        g = cfg.sampling.group_size
        episodes = [
            batch.episodes[i - i % g] if 0 < i % g < 6 else e for i, e in enumerate(batch.episodes)
        ]
        result, one = await asyncio.gather(
            c.trainer.train_step(episodes, None), single.train_step(episodes, None)
        )
        # The ranks' shares add up to the whole batch's loss and statistics, and the gradient
        # (whose norm is taken before clipping, and which Adam's scale invariance would hide
        # from a comparison of weights) is the one-process gradient.
        assert result.stats.tokens == one.stats.tokens
        assert result.stats.loss == pytest.approx(one.stats.loss, rel=1e-4, abs=1e-6)
        assert result.stats.ratio_mean == pytest.approx(one.stats.ratio_mean, rel=1e-5)
        assert result.grad_norm == pytest.approx(one.grad_norm, rel=1e-4)
        assert isinstance(result.weights, ShardedManifest)
        assert isinstance(one.weights, Manifest)
        assert len(result.weights.exports) == cfg.trainer.procs
        assert result.version == version + 1
        synced = await sync_weights(c, result.update)
        assert synced.version == version + 1
        assert synced.transport == "shm"  # every rank on this machine: shared memory

        full = await c.trainer.full_weights()
        got_version, got = await generator_weights(c)
        assert got_version == version + 1
        assert set(got) == set(full)
        for name, tensor in full.items():
            assert got[name].dtype == tensor.dtype, name
            assert torch.equal(bits(got[name]), bits(tensor)), (version, name)
        reference = await single.full_weights()
        diffs.append(max((reference[n] - full[n]).abs().max().item() for n in full))
    return diffs


# Three groups over two ranks (32 and 16 rows), prompts shared (each pass two calls of the
# model on every rank: the prompts, then the packed responses). Budget 1: every row its own
# pass, and the rank with fewer rows runs weight-0 passes to keep the collectives in step.
# Budget 0: one pass a rank.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("budget", ["1", "0"])
def test_sharded_trainer_weights_reach_the_generator_bit_for_bit(
    tmp_path: Path, budget: str
) -> None:
    cfg = apply_overrides(
        tiny(),
        {
            "trainer.procs": "2",
            "trainer.batch_size": "48",
            "trainer.micro_batch_tokens": budget,
            "generator.replicas": "1",
            "mode": "sync",
            "steps": str(STEPS),
            "out_dir": str(tmp_path),
        },
    )
    prep = prepare(cfg)

    async def main() -> None:
        c = await spawn_components(cfg, prep, print)
        single_cfg = apply_overrides(cfg, {"trainer.procs": "1"})
        single = await spawn_trainer(single_cfg, prep, c.procs, c.hosts)
        try:
            initial = await c.trainer.publish_initial()
            await sync_weights(c, initial)
            _, before = await generator_weights(c)
            full = await c.trainer.full_weights()
            assert all(torch.equal(bits(before[n]), bits(full[n])) for n in full)

            diffs = await run_steps(c, cfg, single)

            _, after = await generator_weights(c)
            assert any(not torch.equal(after[n], before[n]) for n in after)  # it trained
            # The 2-rank trainer's checkpoint (a distributed checkpoint, each rank its
            # shards) loads into one process: a run may resume with another trainer.procs.
            await c.trainer.save(tmp_path / "ckpt")
            await c.trainer.saved()
            restored = await spawn_trainer(single_cfg, prep, c.procs, c.hosts, tmp_path / "ckpt")
            assert (await restored.publish_initial()).version == STEPS
            full, back = await c.trainer.full_weights(), await restored.full_weights()
            assert all(torch.equal(bits(back[n]), bits(full[n])) for n in full)
            # The sharded step is the one-process step: same loss normalisation, gradients
            # averaged over ranks; only the order of floating-point sums differs.
            assert max(diffs) < 1e-5, diffs
        finally:
            await shutdown(c)

    asyncio.run(main())


@pytest.mark.timeout(420)
def test_a_sharded_trainer_whose_rank_aborts_is_restored(tmp_path: Path) -> None:
    # Monarch reports a rank's death as the failure of its SPMD set-up actor's mesh too; the
    # controller must take that as the trainer's death (restore it), not hand it to the
    # hook that interrupts the controller, which ended the run at step 4 as if Ctrl-C.
    cfg = apply_overrides(
        tiny(),
        {
            "trainer.procs": "2",
            "steps": "8",
            "checkpoint.every": "2",
            "eval_every": "0",
            "out_dir": str(tmp_path),
        },
    )
    started: list[Components] = []
    aborted: list[int] = []

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        if row.version == KILL_AT and row.trainer_restores == 0:
            aborted.append(started[0].trainer.pid_list[1])
            os.kill(aborted[0], signal.SIGABRT)

    lines: list[str] = []
    summary = asyncio.run(
        run(
            cfg, prepare(cfg), quiet=True, on_step=on_step, log=lines.append, spawn=keeping(started)
        )
    )
    assert summary.steps == 8, lines
    assert not [x for x in lines if "SIGINT" in x], lines
    assert_trainer_restored(lines, tmp_path, KILL_AT)
    (died,) = [x for x in lines if x.startswith("[trainer died:")]
    stacks = tmp_path / "crashes" / f"trainer-{aborted[0]}.txt"
    assert f"; pid {aborted[0]} crashed in " in died, died
    assert f"(Fatal Python error: Aborted), stacks in {stacks}; restoring it" in died, died
