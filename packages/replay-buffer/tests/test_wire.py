"""Batches of episodes across a process boundary: `EpisodeBatch` and `SampledBatch` pickle as
one columnar record and come back exactly, field by field."""

from __future__ import annotations

import pickle

import pytest
import torch
from replay_buffer import Episode, EpisodeBatch, SampledBatch


def _episode(i: int, *, mask: bool = False, token_adv: bool = False) -> Episode:
    n = 2 + i % 5  # responses of different lengths
    return Episode(
        prompt_ids=torch.arange(1 + i % 3) + 100 * i,
        response_ids=torch.arange(n) + 2**40,
        behavior_logprobs=-torch.arange(n, dtype=torch.float32) / (i + 1) - 1e-30,
        reward=float(i) / 7,
        advantage=-float(i) / 3,
        policy_version=i // 4,
        group_id=i // 4 if i % 2 else f"g{i}",
        metadata={"i": i, "tags": [i, "x"]},
        loss_mask=(torch.arange(n) % 2 == 0) if mask else None,
        token_advantages=torch.full((n,), float(i)) if token_adv else None,
    )


def _assert_same(a: Episode, b: Episode) -> None:
    for name in ("prompt_ids", "response_ids", "behavior_logprobs"):
        x, y = getattr(a, name), getattr(b, name)
        assert y.dtype == x.dtype, name
        assert torch.equal(x, y), name
    for name in ("loss_mask", "token_advantages"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert y.dtype == x.dtype, name
            assert torch.equal(x, y), name
    assert (a.reward, a.advantage, a.policy_version) == (b.reward, b.advantage, b.policy_version)
    assert (a.group_id, a.metadata) == (b.group_id, b.metadata)


def test_batch_round_trip_is_exact_with_optional_fields_on_some_episodes() -> None:
    episodes = [_episode(i, mask=i % 3 == 0, token_adv=i % 4 == 1) for i in range(13)]
    back = pickle.loads(pickle.dumps(EpisodeBatch(episodes)))
    assert isinstance(back, EpisodeBatch)
    assert len(back) == 13
    for a, b in zip(episodes, back, strict=True):
        _assert_same(a, b)


def test_batch_without_optional_fields_and_empty_batch() -> None:
    episodes = [_episode(i) for i in range(5)]
    back = pickle.loads(pickle.dumps(EpisodeBatch(episodes)))
    for a, b in zip(episodes, back, strict=True):
        _assert_same(a, b)
    assert len(pickle.loads(pickle.dumps(EpisodeBatch()))) == 0


def test_unpickled_episodes_own_their_values() -> None:
    episodes = [_episode(i) for i in range(3)]
    back = pickle.loads(pickle.dumps(EpisodeBatch(episodes)))
    back[1].response_ids[0] = -5  # a view into the batch's buffer, not into the sender's
    assert episodes[1].response_ids[0] == 2**40
    assert back[0].response_ids[-1] == episodes[0].response_ids[-1]
    assert back[2].response_ids[0] == 2**40
    # An unpickled episode pickles again on its own, and so does a slice of the batch.
    _assert_same(episodes[2], pickle.loads(pickle.dumps(back[2])))
    again = pickle.loads(pickle.dumps(back[1:]))
    assert isinstance(again, EpisodeBatch)
    assert [e.policy_version for e in again] == [0, 0]


class Tagged(torch.Tensor):
    """A tensor subclass: pickled as itself, never as raw bytes."""


def test_a_tensor_that_is_not_plain_falls_back_to_one_episode_at_a_time() -> None:
    odd = Episode(
        prompt_ids=torch.tensor([1, 2]).as_subclass(Tagged),
        response_ids=torch.tensor([3]),
        behavior_logprobs=torch.tensor([-0.5]),
        reward=0.0,
        advantage=0.0,
        policy_version=0,
    )
    back = pickle.loads(pickle.dumps(EpisodeBatch([_episode(0), odd])))
    _assert_same(odd, back[1])
    assert type(back[1].prompt_ids) is Tagged


def test_batch_is_smaller_than_a_list_of_the_same_episodes() -> None:
    episodes = [_episode(i) for i in range(64)]
    assert len(pickle.dumps(EpisodeBatch(episodes))) < len(pickle.dumps(episodes))


def test_batch_refuses_what_is_not_an_episode() -> None:
    with pytest.raises(TypeError, match=r"EpisodeBatch\[1\] must be an Episode, got dict"):
        EpisodeBatch([_episode(0), {"reward": 1.0}])  # type: ignore[list-item]


def test_sampled_batch_keeps_its_shards_and_version() -> None:
    episodes = [_episode(i, mask=i == 2) for i in range(6)]
    batch = SampledBatch((tuple(episodes[:3]), tuple(episodes[3:])), curr_policy_version=9)
    back = pickle.loads(pickle.dumps(batch))
    assert back.curr_policy_version == 9
    assert [len(s) for s in back.shards] == [3, 3]
    for a, b in zip(batch.episodes, back.episodes, strict=True):
        _assert_same(a, b)
