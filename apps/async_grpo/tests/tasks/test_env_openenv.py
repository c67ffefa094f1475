"""An OpenEnv environment through the app's rollout code: a real OpenEnv server process on
127.0.0.1 (rl-envs' test server, built with openenv-core's server classes), served by an
environment service, played by `multiturn.play` with the app's model, and turned into
trainable episodes by `rollout.records_to_episodes`."""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "openenv", reason="needs openenv-core: install async-grpo[openenv] (the nox session does)"
)

from actor_service import ServiceConfig
from async_grpo.config.presets import TINY_ARCH
from async_grpo.config.schema import ModelConfig, SamplingConfig
from async_grpo.controller.play import make_encode
from async_grpo.generation.decoding import Completion
from async_grpo.generation.engines.hf import HFEngine
from async_grpo.generation.episodes import records_to_episodes
from async_grpo.generation.multiturn import play
from async_grpo.model.policy import load_tokenizer, write_random_checkpoint
from rl_envs import Task, spawn_environment
from rl_envs.openenv_adapter import OpenEnvEnvironment

SERVER = Path(__file__).resolve().parents[4] / "packages/rl-envs/tests/openenv_server.py"
WORDS = "amber birch cedar delta ember fjord glade heron"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port)])
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"the OpenEnv server exited with {proc.returncode}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the OpenEnv server did not come up"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(300)
@pytest.mark.slow  # an OpenEnv server and Monarch processes
def test_openenv_episodes_through_the_app_rollout(server: str, tmp_path: Path) -> None:
    checkpoint = write_random_checkpoint(tmp_path / "ckpt", TINY_ARCH, [f"say {WORDS}"], seed=0)
    tokenizer = load_tokenizer(str(checkpoint))
    encode = make_encode(tokenizer)
    sampling = SamplingConfig(group_size=4, max_new_tokens=1)
    engine = HFEngine(str(checkpoint), ModelConfig(), sampling, seed=0)

    async def oracle(contexts: list[list[int]]) -> list[Completion]:
        # Says the word the server asked for: the last token of the conversation so far.
        return [
            Completion("", str(tokenizer.decode([c[-1]])), [], [c[-1]], [-0.5], False, 3)
            for c in contexts
        ]

    async def model(contexts: list[list[int]]) -> list[Completion]:
        return engine.continue_turns(contexts)

    async def main() -> tuple[list[list[object]], list[list[object]]]:
        config = ServiceConfig(replicas=2, name="echo", max_in_flight_per_replica=16)
        async with await spawn_environment(
            OpenEnvEnvironment, config, base_url=server, name="echo", text_field="prompt"
        ) as env:
            tasks = [Task("echo", seed=s) for s in range(3)]
            kwargs = {"max_turns": 5, "step_timeout_s": 30.0}
            right = await play(oracle, encode, {"echo": env}, tasks, 4, **kwargs)  # type: ignore[arg-type]
            sampled = await play(model, encode, {"echo": env}, tasks, 4, **kwargs)  # type: ignore[arg-type]
            return right, sampled  # type: ignore[return-value]

    right, sampled = asyncio.run(main())
    for groups in (right, sampled):
        assert [len(g) for g in groups] == [4, 4, 4]
        for record in (r for g in groups for r in g):
            assert record.ok, record.error  # type: ignore[attr-defined]
            assert record.done  # type: ignore[attr-defined]
            assert record.turns == 3  # type: ignore[attr-defined]
    # The oracle is right every turn: the server's rewards (1/3 a word) add up to 1.
    assert [r.reward for g in right for r in g] == pytest.approx([1.0] * 12)  # type: ignore[attr-defined]
    episodes, dropped = records_to_episodes(right, itertools.count(), encode)  # type: ignore[arg-type]
    assert dropped == 0
    assert len(episodes) == 12
    first = right[0][0]
    # "say W1" | W1 | "say W2" | W2 | "say W3" | W3: three policy tokens, two of context.
    e = episodes[0]
    assert e.prompt_ids.tolist() == encode(first.segments[0].text)  # type: ignore[attr-defined]
    assert e.loss_mask is not None
    assert e.loss_mask.tolist() == [True, False, False, True, False, False, True]
    assert e.behavior_logprobs[e.loss_mask].tolist() == [-0.5, -0.5, -0.5]
    assert e.policy_version == 3
    assert all(x.advantage == 0.0 for x in episodes)  # every answer right: nothing to learn
    # The model's own episodes become trainable episodes the same way.
    trained, _ = records_to_episodes(sampled, itertools.count(), encode)  # type: ignore[arg-type]
    assert len(trained) == 12
    assert all(int(x.loss_mask.sum()) == 3 for x in trained if x.loss_mask is not None)
