"""OpenEnv interop against a real OpenEnv server process on 127.0.0.1 (the environment in
`openenv_server.py`, built with openenv-core's server classes), driven by `run_episode`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytest.importorskip(
    "openenv", reason="needs openenv-core: install rl-envs[openenv] (the nox session does)"
)

from actor_service import ServiceConfig
from policies import Payload
from rl_envs import PolicyTurn, Segment, Task, run_episode, spawn_environment
from rl_envs.openenv_adapter import OpenEnvEnvironment

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SERVER = Path(__file__).with_name("openenv_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the OpenEnv server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the OpenEnv server did not come up within 60 s")


def serve() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = start_server(port)
    yield f"http://127.0.0.1:{port}", proc
    proc.kill()
    proc.wait()


# Starting a server imports openenv-core (and its Gradio UI): ~15 s. Share one where the
# test leaves it running.
server = pytest.fixture(scope="module")(serve)
own_server = pytest.fixture(serve)


class Echo:
    """Says the word the server asks for (or a wrong one on the turns in `wrong_on`)."""

    def __init__(self, wrong_on: Sequence[int] = ()) -> None:
        self.wrong_on = set(wrong_on)

    async def __call__(self, conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
        turn = sum(s.source == "policy" for s in conversation)
        word = conversation[-1].text.split()[-1]
        return PolicyTurn("nope" if turn in self.wrong_on else word, (turn,))


async def test_whole_episodes_through_an_environment_service(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = server
    config = ServiceConfig(replicas=2, name="echo")
    async with await spawn_environment(
        OpenEnvEnvironment, config, base_url=url, name="echo", text_field="prompt"
    ) as env:
        assert env.name == "echo"
        import asyncio  # noqa: PLC0415

        tasks = [Task("echo", seed=s) for s in range(6)]
        records = await asyncio.gather(*(run_episode(Echo(), env, t) for t in tasks))
        assert all(r.ok and r.done for r in records), [r.error for r in records]
        assert [r.reward for r in records] == pytest.approx([1.0] * 6)
        assert [r.turns for r in records] == [3] * 6
        # The seed fixes the server's episode: same task, same words.
        again = await run_episode(Echo(), env, tasks[0])
        assert again.segments == records[0].segments
        assert records[0].segments[0].text.startswith("say ")
        partly = await run_episode(Echo(wrong_on=[1]), env, Task("echo", seed=1))
        assert partly.rewards == pytest.approx((1 / 3, 0.0, 1 / 3))


async def test_a_local_adapter_and_its_state(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = server
    env = OpenEnvEnvironment(url, name="echo", text_field="prompt")
    first = await env.reset(Task("echo", seed=4))
    result = await env.step(__import__("rl_envs").Action(first.text.split()[-1]))
    assert result.reward == pytest.approx(1 / 3)
    state = await env.state()
    assert state.turns == 1
    assert state.info["step_count"] == 1  # the server's own state
    await env.close()
    guessed = OpenEnvEnvironment(url, name="echo")  # no text_field: the only str field
    assert (await guessed.reset(Task("echo", seed=4))).text == first.text
    await guessed.close()


async def test_a_server_that_dies_fails_the_episode_cleanly(
    own_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = own_server

    class KillServer(Echo):
        async def __call__(self, conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
            if len(conversation) > 1:
                proc.kill()
                proc.wait()
            return await super().__call__(conversation)

    async with await spawn_environment(
        OpenEnvEnvironment, ServiceConfig(name="echo"), base_url=url, name="echo"
    ) as env:
        record = await run_episode(KillServer(), env, Task("echo", seed=0), step_timeout_s=30)
    assert not record.ok
    assert record.error is not None
    assert record.error.kind == "environment_error"
    assert record.error.turns == 1
    assert record.segments == ()


def test_missing_websockets_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "websockets.asyncio.client", None)
    with pytest.raises(ImportError, match=r"install rl-envs\[openenv\]"):
        OpenEnvEnvironment("http://127.0.0.1:1")


async def test_no_server_is_an_environment_error() -> None:
    env = OpenEnvEnvironment(f"http://127.0.0.1:{free_port()}", name="echo", connect_timeout_s=2)
    record = await run_episode(Echo(), env, Task("echo", seed=0))
    assert record.error is not None
    assert record.error.kind == "environment_error"
    assert "cannot connect to the OpenEnv server" in record.error.message
