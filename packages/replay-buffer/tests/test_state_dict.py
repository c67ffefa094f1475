"""Checkpoints: `state_dict()` / `load_state_dict()` resume exactly, or refuse and change
nothing."""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
from typing import Any

import pytest
import torch
from replay_buffer import Episode, FifoSampling, ReplayBuffer, ReplayBufferConfig
from replay_buffer.actor import BufferSnapshot
from replay_buffer.testing import make_episode, make_group, states_equal

CONFIGS = [
    ReplayBufferConfig(sampling="fifo", max_resample_count=1, max_policy_age=3, seed=1),
    ReplayBufferConfig(sampling="uniform", max_buffer_size=30, max_resample_count=2, seed=2),
    ReplayBufferConfig(sampling="prioritized", max_policy_age=2, dp_size=2, seed=3),
]


def fill(buffer: ReplayBuffer, start: int, n: int, version: int) -> None:
    episodes = [
        make_episode(policy_version=version, advantage=(i % 5) - 2.0, metadata={"id": i})
        for i in range(start, start + n)
    ]
    buffer.add_many(episodes)


def sample_ids(buffer: ReplayBuffer, version: int, batch_size: int) -> list[int] | None:
    batch = buffer.sample(version, batch_size)
    return None if batch is None else [e.metadata["id"] for e in batch.episodes]


def busy_buffer(config: ReplayBufferConfig) -> ReplayBuffer:
    buffer = ReplayBuffer(config)
    for version in range(4):
        fill(buffer, 100 * version, 12, version)
        sample_ids(buffer, version, 4)
    return buffer


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.sampling)
def test_a_restored_buffer_samples_exactly_like_the_original(config: ReplayBufferConfig) -> None:
    original = busy_buffer(config)
    restored = ReplayBuffer(config)
    restored.load_state_dict(original.state_dict())
    assert states_equal(restored.state_dict(), original.state_dict())
    assert restored.stats() == original.stats()
    for version in range(4, 8):
        fill(original, 100 * version, 6, version)
        fill(restored, 100 * version, 6, version)
        assert sample_ids(original, version, 4) == sample_ids(restored, version, 4)
    assert restored.stats() == original.stats()


def test_state_dict_survives_torch_save_with_weights_only() -> None:
    config = ReplayBufferConfig(sampling="uniform", group_size=2, seed=4)
    original = ReplayBuffer(config)
    for g in range(5):
        original.add_many(make_group(g, 2, policy_version=g))
    original.sample(5, 2)
    file = io.BytesIO()
    torch.save(original.state_dict(), file)
    file.seek(0)
    state = torch.load(file, weights_only=True)
    restored = ReplayBuffer(config)
    restored.load_state_dict(state)
    assert states_equal(restored.state_dict(), original.state_dict())
    a, b = original.sample(5, 4), restored.sample(5, 4)
    assert a is not None
    assert b is not None
    assert [(e.group_id, e.metadata) for e in a.episodes] == [
        (e.group_id, e.metadata) for e in b.episodes
    ]


def test_a_different_config_is_refused() -> None:
    state = busy_buffer(CONFIGS[0]).state_dict()
    other = ReplayBuffer(ReplayBufferConfig(sampling="fifo", max_resample_count=1, seed=1))
    with pytest.raises(ValueError, match=r"max_policy_age \(saved 3, here None\)"):
        other.load_state_dict(state)


class OtherFifo(FifoSampling):
    """Same behaviour as FIFO, different type: its state must not be mistaken for FIFO's."""


def test_a_different_policy_is_refused() -> None:
    state = busy_buffer(CONFIGS[0]).state_dict()
    other = ReplayBuffer(CONFIGS[0], policy=OtherFifo())
    with pytest.raises(ValueError, match=r"saved with sampling policy \S+\.FifoSampling, this"):
        other.load_state_dict(state)


def corrupt(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of `state` with the entry at `path` replaced (containers copied on the way)."""
    state = dict(state)
    node: Any = state
    for key in path[:-1]:
        child = node[key]
        child = dict(child) if isinstance(child, dict) else list(child)
        node[key] = child
        node = child
    node[path[-1]] = value
    return state


BAD_STATES = [
    ((("format_version",), 99), "format_version 99 is not supported"),
    ((("next_key",), -1), "next_key must be an int >= 0"),
    ((("rng_state",), (1, 2)), "rng_state is malformed"),
    ((("items", 0, "key"), 10**9), "out of order or not below next_key"),
    ((("items", 0, "times_sampled"), 5), "exceeds max_resample_count"),
    ((("items", 0, "episodes", 0), {"reward": 1.0}), "holds a bad episode"),
    ((("items", 0, "episodes"), []), "holds 0 episodes, expected 1"),
    ((("items", 0), 3), "items are malformed"),
    ((("policy",), {"keys": [1, 2]}), "does not list exactly the held keys"),
    ((("counters", "added"), -1.5), "counter 'added' must be an int"),
]


@pytest.mark.parametrize(("change", "message"), BAD_STATES)
def test_a_malformed_state_is_refused_and_the_buffer_is_unchanged(
    change: tuple[tuple[Any, ...], Any], message: str
) -> None:
    config = ReplayBufferConfig(sampling="uniform", max_resample_count=1, seed=7)
    state = busy_buffer(config).state_dict()
    target = ReplayBuffer(config)
    fill(target, 1000, 3, 0)
    before = target.state_dict()
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(corrupt(state, *change))
    assert states_equal(target.state_dict(), before)


def test_not_a_state_dict_is_refused() -> None:
    with pytest.raises(ValueError, match="not a replay-buffer state_dict"):
        ReplayBuffer().load_state_dict({"weights": torch.zeros(1)})


def test_restored_group_ids_are_still_unique() -> None:
    config = ReplayBufferConfig(group_size=2)
    original = ReplayBuffer(config)
    original.add_many(make_group("a", 2))
    restored = ReplayBuffer(config)
    restored.load_state_dict(original.state_dict())
    with pytest.raises(ValueError, match="group_id='a' is already held"):
        restored.add_many(make_group("a", 2))


def test_loaded_episodes_are_validated_episodes() -> None:
    original = ReplayBuffer()
    original.add(make_episode(reward=2.0))
    restored = ReplayBuffer()
    restored.load_state_dict(original.state_dict())
    batch = restored.sample(0, 1)
    assert batch is not None
    (episode,) = batch.episodes
    assert isinstance(episode, Episode)
    assert episode.reward == 2.0


def test_a_version_1_state_without_loss_masks_still_loads() -> None:
    source = ReplayBuffer(ReplayBufferConfig(max_policy_age=2, seed=0))
    masked = make_episode(policy_version=0)
    masked = Episode(
        prompt_ids=masked.prompt_ids,
        response_ids=masked.response_ids,
        behavior_logprobs=masked.behavior_logprobs,
        reward=masked.reward,
        advantage=masked.advantage,
        policy_version=0,
        loss_mask=torch.ones(len(masked.response_ids), dtype=torch.bool),
    )
    source.add_many([masked, make_episode(policy_version=0)])
    state = source.state_dict()
    restored = ReplayBuffer(ReplayBufferConfig(max_policy_age=2, seed=0))
    restored.load_state_dict(state)
    kept = [e["loss_mask"] for item in state["items"] for e in item["episodes"]]
    assert kept[0] is not None
    assert kept[1] is None
    # The same state as version 1 wrote it: no loss_mask (nor token_advantages) key.
    old = copy.deepcopy(state)
    old["format_version"] = 1
    for item in old["items"]:
        for e in item["episodes"]:
            del e["loss_mask"]
            del e["token_advantages"]
    restored_old = ReplayBuffer(ReplayBufferConfig(max_policy_age=2, seed=0))
    restored_old.load_state_dict(old)
    assert restored_old.stats().held == 2


def test_every_episode_field_is_saved() -> None:
    # Read from the dataclass, so a field added to `Episode` later survives a checkpoint.
    buffer = ReplayBuffer()
    buffer.add(make_episode(reward=1.0))
    (saved,) = buffer.state_dict()["items"][0]["episodes"]
    assert set(saved) == {f.name for f in dataclasses.fields(Episode)}


def test_token_advantages_are_restored() -> None:
    source = ReplayBuffer()
    plain = make_episode(reward=1.0)
    n = len(plain.response_ids)
    source.add(
        Episode(
            prompt_ids=plain.prompt_ids,
            response_ids=plain.response_ids,
            behavior_logprobs=plain.behavior_logprobs,
            reward=1.0,
            advantage=0.5,
            policy_version=0,
            token_advantages=torch.arange(n, dtype=torch.float32),
        )
    )
    restored = ReplayBuffer()
    restored.load_state_dict(source.state_dict())
    batch = restored.sample(0, 1)
    assert batch is not None
    (episode,) = batch.episodes
    assert episode.token_advantages is not None
    assert episode.token_advantages.tolist() == list(range(n))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.sampling)
def test_a_snapshot_crosses_as_one_record_and_arrives_whole(config: ReplayBufferConfig) -> None:
    original = busy_buffer(config)
    plain = make_episode(policy_version=3, metadata={"id": 900})
    n = len(plain.response_ids)
    original.add_many(
        [
            dataclasses.replace(plain, loss_mask=torch.tensor([True, False] * (n // 2))),
            dataclasses.replace(
                plain, metadata={"id": 901}, token_advantages=torch.linspace(-1, 1, n)
            ),
        ]
    )
    state = original.state_dict()
    data = pickle.dumps(BufferSnapshot(state, groups=((7, 3),)))
    # Its episodes are bytes of one columnar record, not a pickled tensor each.
    assert b"_rebuild_tensor" not in data
    back = pickle.loads(data)
    assert back.groups == ((7, 3),)
    assert states_equal(back.state, state)
    restored = ReplayBuffer(config)
    restored.load_state_dict(back.state)
    for version in range(4, 7):
        fill(original, 100 * version, 6, version)
        fill(restored, 100 * version, 6, version)
        assert sample_ids(original, version, 4) == sample_ids(restored, version, 4)
