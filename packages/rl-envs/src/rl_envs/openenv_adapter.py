"""OpenEnv interop: any OpenEnv environment server as an `Environment`, so as a service.

    env = await spawn_environment(
        OpenEnvEnvironment, ServiceConfig(replicas=2, name="echo"),
        base_url="http://127.0.0.1:8000", name="echo", text_field="prompt",
    )
    record = await run_episode(policy, env, Task("echo", seed=3))

Each episode opens its own session on the server: a WebSocket on its `/ws` endpoint, the
session protocol of `openenv-core` (0.3) that OpenEnv's own `EnvClient` speaks: JSON
messages `{"type": "reset" | "step" | "state" | "close", "data": ...}` answered by
`{"type": "observation" | "state" | "error", "data": ...}`. `reset(task)` sends
`reset(seed=task.seed)` (or what `reset_args(task)` returns), `step(Action(text))` sends
`{action_field: text}`, and the server's observation dict becomes the observation text
(`text_field`, or its only string field, or its JSON). OpenEnv's reward (None counts as
0.0) and `done` pass through unchanged: their range is the server's.

The session is spoken here over `websockets` rather than through `openenv.core`'s client
class because importing `openenv.core` imports its Gradio web UI (about 13 s of CPU per
process, measured): every environment replica would pay it. The `rl-envs[openenv]` extra
installs openenv-core (servers are built with it; the tests run one) and `websockets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from rl_envs._checks import check_name, check_number
from rl_envs.environment import Environment
from rl_envs.errors import EnvError
from rl_envs.types import Action, Info, Observation, StepResult, Task

_MAX_MESSAGE = 64 << 20  # observations can be large (screenshots, DOM dumps)


def _ws_url(url: str) -> str:
    url = url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            return ws + url[len(http) :]
    return url if url.startswith(("ws://", "wss://")) else "ws://" + url


def default_reset_args(task: Task) -> dict[str, Any]:
    """OpenEnv's `reset(seed=...)`: the task's seed fixes the server's episode."""
    return {"seed": task.seed}


class OpenEnvEnvironment(Environment):
    """An OpenEnv server's environment (see the module docstring).

    Args:
        base_url: the server, e.g. `http://127.0.0.1:8000` (`ws://` works too).
        name: the name tasks use for it (`Task.env`).
        action_field: the field of the server's Action model that carries the text.
        text_field: the observation field that is the text the policy reads; by default
            the observation's only string field, or else its JSON.
        reset_args: the keyword arguments of the server's `reset` for a task.
        connect_timeout_s, message_timeout_s: the client's timeouts.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "openenv",
        action_field: str = "message",
        text_field: str | None = None,
        reset_args: Callable[[Task], Mapping[str, Any]] = default_reset_args,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        super().__init__()
        try:
            from websockets.asyncio.client import connect  # noqa: PLC0415
        except ImportError as e:
            raise ImportError(
                "OpenEnvEnvironment needs the package websockets: install rl-envs[openenv]"
            ) from e
        self._connect = connect
        self.base_url = check_name("OpenEnvEnvironment base_url", base_url)
        self.name = check_name("OpenEnvEnvironment name", name)
        self.action_field = check_name("OpenEnvEnvironment action_field", action_field)
        self.text_field = text_field
        self.reset_args = reset_args
        self.connect_timeout_s = check_number("connect_timeout_s", connect_timeout_s, 1e-3)
        self.message_timeout_s = check_number("message_timeout_s", message_timeout_s, 1e-3)
        self._ws: Any = None

    async def _reset(self, task: Task) -> Observation:
        await self.close()
        url = _ws_url(self.base_url) + "/ws"
        try:
            self._ws = await self._connect(
                url, open_timeout=self.connect_timeout_s, max_size=_MAX_MESSAGE
            )
        except (OSError, TimeoutError) as e:
            raise EnvError(f"{self.name}: cannot connect to the OpenEnv server {url}: {e}") from e
        data = await self._request("reset", dict(self.reset_args(task)))
        return Observation(self._text(data.get("observation", {})))

    async def _step(self, action: Action) -> StepResult:
        data = await self._request("step", {self.action_field: action.text})
        reward = data.get("reward")
        reward = 0.0 if reward is None else float(reward)
        text = self._text(data.get("observation", {}))
        return StepResult(Observation(text), reward, bool(data.get("done", False)))

    async def _info(self) -> Info:
        if self._ws is None:
            return {}
        state = await self._request("state", None)
        return {k: v for k, v in state.items() if isinstance(v, str | int | float | bool)}

    async def close(self) -> None:
        """Ends the episode's session on the server."""
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):  # the server may be gone already
                await ws.send(json.dumps({"type": "close"}))
            await ws.close()

    async def _request(self, kind: str, data: Mapping[str, Any] | None) -> dict[str, Any]:
        """One request and its answer; an error answer raises `EnvError` with the
        server's message."""
        message: dict[str, Any] = {"type": kind}
        if data is not None:
            message["data"] = data
        await self._ws.send(json.dumps(message))
        raw = await asyncio.wait_for(self._ws.recv(), self.message_timeout_s)
        answer = json.loads(raw)
        body = answer.get("data", {}) if isinstance(answer, dict) else {}
        if not isinstance(answer, dict) or answer.get("type") == "error":
            raise EnvError(
                f"{self.name}: the OpenEnv server refused {kind!r}: "
                f"{body.get('message', answer)} (code {body.get('code', '?')})"
            )
        if not isinstance(body, dict):
            raise EnvError(f"{self.name}: malformed OpenEnv answer to {kind!r}: {answer!r:.200}")
        return body

    def _text(self, observation: Mapping[str, Any]) -> str:
        if self.text_field is not None:
            if self.text_field not in observation:
                raise EnvError(
                    f"{self.name}: the server's observation has no field {self.text_field!r} "
                    f"(fields: {sorted(observation)})"
                )
            return str(observation[self.text_field])
        strings = [v for v in observation.values() if isinstance(v, str)]
        if len(strings) == 1:
            return strings[0]
        return json.dumps(dict(observation), sort_keys=True, default=str)
