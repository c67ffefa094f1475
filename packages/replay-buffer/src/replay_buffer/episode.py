"""The unit the buffer stores: one scored response to one prompt."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

GroupId = int | str
"""Identifies the GRPO group (the responses to one prompt) an episode belongs to."""


@dataclass(frozen=True, kw_only=True, eq=False, slots=True)
class Episode:
    """One scored response to one prompt, tagged with the policy version that produced it.

    Every field is checked on construction; a bad field raises `TypeError` or `ValueError`
    naming it, so a malformed episode never reaches the buffer. Tensors are stored as given
    (no copy); treat them as read-only once the episode exists. Equality is identity: two
    episodes with equal contents are still two episodes.

    Attributes:
        prompt_ids: token ids of the prompt, shape `(P,)`, dtype `torch.long`, `P >= 1`.
        response_ids: token ids the behaviour policy generated, shape `(R,)`, dtype
            `torch.long`, `R >= 1`.
        behavior_logprobs: natural-log probability of each response token under the policy
            that generated it, shape `(R,)` (same length as `response_ids`), dtype
            `torch.float32`, every value finite and `<= 0`, not requiring grad. The trainer
            needs them for the importance ratio of off-policy (stale) data.
        reward: scalar score of the response (finite; units are the reward function's).
        advantage: the reward's advantage over its baseline, e.g. the group-normalised reward
            in GRPO (finite). The prioritized sampling policy weighs episodes by
            `|advantage|`.
        policy_version: version of the policy weights that generated the response, an
            integer `>= 0` counted in trainer updates. Its age at sampling time is
            `curr_policy_version - policy_version`.
        group_id: the group this episode belongs to (responses to the same prompt), `int` or
            `str`; required when the buffer keeps groups whole (`group_size` set).
        metadata: free-form extras (task name, prompt text, ...); the buffer never reads it.
        loss_mask: which response tokens the policy produced, shape `(R,)`, dtype
            `torch.bool`, at least one True; None (the default) means all of them. A
            multi-turn episode's response also holds what the environment answered between
            the policy's turns: those tokens are context for the next turn but not the
            policy's actions, so they are False here, are never trained on, and their
            `behavior_logprobs` entries are ignored (0.0 by convention).
        token_advantages: a separate advantage for each response token, shape `(R,)`,
            dtype `torch.float32`, every value finite; None (the default) means `advantage`
            for every token. A multi-turn episode uses it to credit each turn with its own
            outcome instead of the whole episode's; entries outside `loss_mask` are never
            read (0.0 by convention). `advantage` still summarises the episode (for
            prioritized sampling and reports).
    """

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    behavior_logprobs: torch.Tensor
    reward: float
    advantage: float
    policy_version: int
    group_id: GroupId | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    loss_mask: torch.Tensor | None = None
    token_advantages: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _check_token_ids("prompt_ids", self.prompt_ids)
        _check_token_ids("response_ids", self.response_ids)
        _check_logprobs(self.behavior_logprobs, len(self.response_ids))
        if self.loss_mask is not None:
            _check_loss_mask(self.loss_mask, len(self.response_ids))
        if self.token_advantages is not None:
            _check_token_advantages(self.token_advantages, len(self.response_ids))
        # Normalise ints (and float subclasses such as numpy.float64) to plain floats.
        object.__setattr__(self, "reward", _finite_float("reward", self.reward))
        object.__setattr__(self, "advantage", _finite_float("advantage", self.advantage))
        check_version("Episode.policy_version", self.policy_version)
        if self.group_id is not None and (
            isinstance(self.group_id, bool) or not isinstance(self.group_id, int | str)
        ):
            raise TypeError(
                f"Episode.group_id must be an int, a str or None, "
                f"got {type(self.group_id).__name__}"
            )
        if not isinstance(self.metadata, dict):
            raise TypeError(f"Episode.metadata must be a dict, got {type(self.metadata).__name__}")

    @property
    def num_tokens(self) -> int:
        """Prompt plus response length, in tokens."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_policy_tokens(self) -> int:
        """Response tokens the policy produced (all of them without a `loss_mask`)."""
        if self.loss_mask is None:
            return len(self.response_ids)
        return int(self.loss_mask.sum())

    def __reduce__(self) -> tuple[Any, ...]:
        # Episodes cross process boundaries (actor messages) in every RL step. Pickling a
        # small tensor the standard way costs ~60-80 us each way; its raw bytes cost ~1 us,
        # which makes sending a batch of episodes ~20x cheaper. Unpickling does not check
        # again: the episode was checked where it was built (see `wire.py` for batches).
        tensors = (self.prompt_ids, self.response_ids, self.behavior_logprobs)
        rest = {
            "reward": self.reward,
            "advantage": self.advantage,
            "policy_version": self.policy_version,
            "group_id": self.group_id,
            "metadata": self.metadata,
            "loss_mask": None if self.loss_mask is None else _tensor_bytes(self.loss_mask),
            "token_advantages": (
                None if self.token_advantages is None else _tensor_bytes(self.token_advantages)
            ),
        }
        return (_rebuild, (tuple(_tensor_bytes(t) for t in tensors), rest))


def _tensor_bytes(tensor: torch.Tensor) -> bytes | torch.Tensor:
    """A CPU tensor's elements as raw bytes (native byte order); other tensors as they are."""
    if tensor.device.type != "cpu" or type(tensor) is not torch.Tensor:
        return tensor
    return cpu_bytes(tensor)


def cpu_bytes(tensor: torch.Tensor) -> bytes:
    """A plain CPU tensor's elements as raw bytes, in order (native byte order)."""
    tensor = tensor.contiguous()
    return ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())


def _from_bytes(data: bytes | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data
    return torch.frombuffer(bytearray(data), dtype=dtype)


def _rebuild(tensors: tuple[bytes | torch.Tensor, ...], rest: dict[str, Any]) -> Episode:
    prompt_ids, response_ids, behavior_logprobs = tensors
    mask = rest.pop("loss_mask", None)
    advantages = rest.pop("token_advantages", None)
    values = {
        "prompt_ids": _from_bytes(prompt_ids, torch.long),
        "response_ids": _from_bytes(response_ids, torch.long),
        "behavior_logprobs": _from_bytes(behavior_logprobs, torch.float32),
        "loss_mask": None if mask is None else _from_bytes(mask, torch.bool),
        "token_advantages": (
            None if advantages is None else _from_bytes(advantages, torch.float32)
        ),
        **rest,
    }
    return trusted_episode([values[name] for name in FIELDS])


FIELDS = tuple(f.name for f in fields(Episode))
"""Every field of `Episode`, in order."""


def trusted_episode(values: Sequence[Any]) -> Episode:
    """An `Episode` of `values` (every field, in `FIELDS` order) without the checks: only
    for the fields of an episode that was checked when it was built, as they come out of a
    pickle."""
    episode = object.__new__(Episode)
    for name, value in zip(FIELDS, values, strict=True):
        object.__setattr__(episode, name, value)
    return episode


def check_version(name: str, version: object) -> int:
    """Returns `version` if it is an int `>= 0` (bools refused), else raises naming `name`."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"{name} must be an int, got {type(version).__name__}")
    if version < 0:
        raise ValueError(f"{name} must be >= 0, got {version}")
    return version


def _check_1d(name: str, tensor: object, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"Episode.{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 1:
        raise ValueError(f"Episode.{name} must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.dtype is not dtype:
        raise TypeError(f"Episode.{name} must have dtype {dtype}, got {tensor.dtype}")
    return tensor


def _check_token_ids(name: str, ids: object) -> None:
    if _check_1d(name, ids, torch.long).shape[0] == 0:
        raise ValueError(f"Episode.{name} must hold at least one token, got 0")


def _check_per_token(
    name: str, value: object, dtype: torch.dtype, response_len: int
) -> torch.Tensor:
    """A 1-D tensor of `dtype` with one value per response token, not requiring grad."""
    tensor = _check_1d(name, value, dtype)
    if tensor.shape[0] != response_len:
        raise ValueError(
            f"Episode.{name} must have one value per response token ({response_len}), "
            f"got {tensor.shape[0]}"
        )
    if tensor.requires_grad:
        raise ValueError(f"Episode.{name} must not require grad; pass {name}.detach()")
    return tensor


def _check_logprobs(value: object, response_len: int) -> None:
    logprobs = _check_per_token("behavior_logprobs", value, torch.float32, response_len)
    # One reduction finds NaN (it propagates), +inf and positive values through `hi`, -inf
    # through `lo`: a log-probability is finite and <= 0.
    lo, hi = (float(v) for v in torch.aminmax(logprobs))
    if not (lo > -math.inf and hi <= 0.0):
        raise ValueError(
            "Episode.behavior_logprobs must be finite natural-log probabilities (<= 0), "
            f"got min={lo}, max={hi}"
        )


def _check_loss_mask(value: object, response_len: int) -> None:
    mask = _check_per_token("loss_mask", value, torch.bool, response_len)
    if not bool(mask.any()):
        raise ValueError("Episode.loss_mask must mark at least one policy token, got none")


def _check_token_advantages(value: object, response_len: int) -> None:
    advantages = _check_per_token("token_advantages", value, torch.float32, response_len)
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError("Episode.token_advantages must be finite, got NaN or inf")


def _finite_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Episode.{name} must be a float, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"Episode.{name} must be finite, got {value}")
    return value
