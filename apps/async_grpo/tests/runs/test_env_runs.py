"""Multi-turn runs with real processes: the pattern preset end to end with a warm-up fill
and an environment replica aborted (SIGABRT) mid-run; the calculator through the real sandbox;
bad `--env.*` input refused before anything starts."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from async_grpo.actors.trainer import TrainResult
from async_grpo.config.presets import calculator, pattern
from async_grpo.generation import multiturn
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components
from async_grpo.observability.metrics import StepRow
from async_grpo.train import run
from jobs import keeping, rows, unaccounted
from rl_envs import run_episode
from rl_envs.sandbox import Sandbox, SandboxUnavailableError

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


@pytest.mark.timeout(400)
def test_pattern_run_warms_up_and_survives_a_killed_environment_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = pattern()
    cfg.steps, cfg.eval_every, cfg.out_dir = 12, 6, str(tmp_path)
    cfg.buffer.warmup_episodes = 384
    started: list[Components] = []
    armed: list[bool] = []
    killed: list[int] = []

    async def kill_mid_episode(policy: Any, *args: Any, **kwargs: Any) -> Any:
        # After step 4, the replica dies while an episode is open on it: between the
        # policy's turn and the step that would send it there.
        async def turn_then_kill(conversation: Any) -> Any:
            turn = await policy(conversation)
            if armed and not killed:
                (pid,) = started[0].envs["pattern"].status().replicas[0].pids
                os.kill(pid, signal.SIGABRT)
                killed.append(pid)
            return turn

        return await run_episode(turn_then_kill, *args, **kwargs)

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        if row.version == 4:
            armed.append(True)

    monkeypatch.setattr(multiturn, "run_episode", kill_mid_episode)
    lines: list[str] = []
    metrics = asyncio.run(
        run(
            cfg, prepare(cfg), quiet=True, on_step=on_step, log=lines.append, spawn=keeping(started)
        )
    ).metrics

    assert killed
    got = rows(tmp_path)
    assert [r["version"] for r in got] == list(range(1, 13))
    # The warm-up fill was there before the first step.
    assert got[0]["episodes_generated"] >= 384
    # Episodes in flight on the killed replica failed; their groups were dropped whole and
    # counted, never trained on; the replica came back and the run finished.
    dropped = got[-1]["episodes_dropped"]
    assert dropped > 0, dropped
    assert dropped % cfg.sampling.group_size == 0, dropped
    assert all(r["episodes_dropped"] == 0 for r in got if r["version"] <= 4)
    assert [unaccounted(r) for r in got] == [0] * len(got)
    (died,) = [x for x in lines if "pattern replica 0 died" in x]
    # An rl-envs replica writes its stacks as the app's processes do, and is named.
    stacks = tmp_path / "crashes" / f"pattern-{killed[0]}.txt"
    assert f"; pid {killed[0]} crashed in " in died, died
    assert f"(Fatal Python error: Aborted), stacks in {stacks}; restarting it" in died, died
    assert any("pattern replica 0 is back after" in x for x in lines), lines
    # Evaluations ran on the held-out pattern tasks, group_size episodes each.
    assert [e.version for e in metrics.evals][:1] == [0]
    assert all(p.startswith("pattern L0 #") for p, _ in metrics.evals[-1].per_prompt)
    assert len(metrics.evals[-1].per_prompt) == cfg.eval_prompts


def _sandbox_or_skip() -> None:
    try:
        Sandbox()
    except SandboxUnavailableError as e:
        if os.environ.get("RL_ENVS_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"RL_ENVS_REQUIRE_SANDBOX=1 but the sandbox is unavailable: {e}")
        pytest.skip(f"needs the distribution package `bubblewrap`: {e}")


@pytest.mark.timeout(300)
def test_calculator_run_scores_answers_in_the_sandbox(tmp_path: Path) -> None:
    _sandbox_or_skip()
    cfg = calculator()
    cfg.steps, cfg.eval_every, cfg.out_dir = 3, 0, str(tmp_path)
    metrics = asyncio.run(run(cfg, prepare(cfg), quiet=True, log=print)).metrics
    got = rows(tmp_path)
    assert [r["version"] for r in got] == [1, 2, 3]
    assert got[-1]["episodes_dropped"] == 0
    # Every episode was played to its end: one attempt, judged by the sandbox.
    assert metrics.episodes_generated >= 3 * cfg.trainer.batch_size
    assert all(0.0 <= r <= 1.0 for r in metrics.rewards)
    shown = metrics.examples(8)
    assert shown
    # One attempt (policy turns would be joined with " | "), at most three words.
    assert all(" | " not in s.response and len(s.response.split()) <= 3 for s in shown)
