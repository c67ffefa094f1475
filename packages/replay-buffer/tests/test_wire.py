"""Batches of episodes across a process boundary: `EpisodeBatch` and `SampledBatch` pickle as
one columnar record and come back exactly, field by field."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
import torch
from replay_buffer import Columns, Episode, EpisodeBatch, SampledBatch, columns_of


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


def test_an_unpickled_sampled_batch_passes_its_record_on() -> None:
    # A controller forwarding the buffer's batch to a trainer sends the record it received,
    # and reads the group ids from it.
    episodes = [_episode(i, mask=i == 2) for i in range(6)]
    sampled = SampledBatch((tuple(episodes[:3]), tuple(episodes[3:])), curr_policy_version=9)
    back = pickle.loads(pickle.dumps(sampled))
    assert back.dp_size == 2
    assert len(back) == 6
    assert back.batch.group_ids() == [e.group_id for e in episodes]
    assert pickle.dumps(back.batch) == pickle.dumps(EpisodeBatch(episodes))
    assert pickle.dumps(back) == pickle.dumps(sampled)
    assert EpisodeBatch(episodes).group_ids() == back.batch.group_ids()


def _expected_columns(episodes: list[Episode]) -> dict[str, torch.Tensor | None]:
    """The `Columns` fields built one episode at a time, the optional ones spelled out."""
    has_mask = any(e.loss_mask is not None for e in episodes)
    has_adv = any(e.token_advantages is not None for e in episodes)
    n = [len(e.response_ids) for e in episodes]
    return {
        "prompt_lens": torch.tensor([len(e.prompt_ids) for e in episodes]),
        "response_lens": torch.tensor(n),
        "prompt_ids": torch.cat([e.prompt_ids for e in episodes]),
        "response_ids": torch.cat([e.response_ids for e in episodes]),
        "behavior_logprobs": torch.cat([e.behavior_logprobs for e in episodes]),
        "loss_mask": torch.cat(
            [
                e.loss_mask if e.loss_mask is not None else torch.ones(k, dtype=torch.bool)
                for e, k in zip(episodes, n, strict=True)
            ]
        )
        if has_mask
        else None,
        "token_advantages": torch.cat(
            [
                e.token_advantages
                if e.token_advantages is not None
                else torch.full((k,), e.advantage)
                for e, k in zip(episodes, n, strict=True)
            ]
        )
        if has_adv
        else None,
        "reward": torch.tensor([e.reward for e in episodes], dtype=torch.float64),
        "advantage": torch.tensor([e.advantage for e in episodes], dtype=torch.float64),
        "policy_version": torch.tensor([e.policy_version for e in episodes]),
    }


@pytest.mark.parametrize("optional", ["none", "some", "all"])
def test_columns_hold_every_field_of_a_list_a_fresh_and_an_unpickled_batch(optional: str) -> None:
    def flags(i: int) -> dict[str, bool]:
        if optional == "none":
            return {}
        if optional == "all":
            return {"mask": True, "token_adv": True}
        return {"mask": i % 3 == 0, "token_adv": i % 4 == 1}

    episodes = [_episode(i, **flags(i)) for i in range(13)]
    expected = _expected_columns(episodes)
    fresh = EpisodeBatch(episodes)
    back = pickle.loads(pickle.dumps(fresh))
    for cols in (fresh.columns(), back.columns(), columns_of(episodes), columns_of(back)):
        assert len(cols) == 13
        for name, want in expected.items():
            got = getattr(cols, name)
            if want is None:
                assert got is None, name
                continue
            assert got is not None, name
            assert got.dtype == want.dtype, name
            assert torch.equal(got, want), name
        assert cols.policy_tokens == sum(e.num_policy_tokens for e in episodes)
        owners = [i for i, e in enumerate(episodes) for _ in range(len(e.response_ids))]
        assert cols.token_episodes().tolist() == owners


def test_an_unpickled_batch_sent_on_pickles_the_same_record() -> None:
    # A batch that only passes through (a controller forwarding it) costs no repacking.
    episodes = [_episode(i, mask=i % 3 == 0) for i in range(9)]
    data = pickle.dumps(EpisodeBatch(episodes))
    back = pickle.loads(data)
    assert pickle.dumps(back) == data
    assert len(back) == 9  # without reading an episode
    for a, b in zip(episodes, pickle.loads(pickle.dumps(back)), strict=True):
        _assert_same(a, b)


def test_slicing_the_whole_batch_is_the_batch_and_a_part_is_its_episodes() -> None:
    back = pickle.loads(pickle.dumps(EpisodeBatch([_episode(i) for i in range(6)])))
    assert back[:] is back
    assert back[0:6] is back
    assert back[::1] is back
    part = back[1:4]
    assert isinstance(part, EpisodeBatch)
    assert len(part) == 3
    assert part.columns().response_lens.tolist() == [len(e.response_ids) for e in back[1:4]]
    assert torch.equal(back[::-1][0].prompt_ids, back[5].prompt_ids)


def test_columns_of_an_empty_batch() -> None:
    cols = pickle.loads(pickle.dumps(EpisodeBatch())).columns()
    assert len(cols) == 0
    assert cols.policy_tokens == 0
    assert cols.prompt_ids.dtype == torch.long
    assert cols.behavior_logprobs.dtype == torch.float32


@pytest.mark.parametrize("optional", ["none", "mask", "token_adv"])
def test_a_batch_from_columns_is_the_batch_of_its_episodes(optional: str) -> None:
    episodes = [
        _episode(i, mask=optional == "mask", token_adv=optional == "token_adv") for i in range(7)
    ]
    for e in episodes:
        e.metadata.clear()  # a batch from columns has no metadata
    cols = columns_of(episodes)
    batch = EpisodeBatch.from_columns(cols, [e.group_id for e in episodes])
    assert batch.columns() is cols
    assert batch.group_ids() == [e.group_id for e in episodes]
    # It pickles as the record the episodes make, and reads back the same episodes.
    assert pickle.dumps(batch) == pickle.dumps(EpisodeBatch(episodes))
    for a, b in zip(episodes, batch, strict=True):
        _assert_same(a, b)
    assert [b.metadata for b in batch] == [{}] * 7
    assert batch[0].metadata is not batch[1].metadata


def _good() -> Columns:
    return columns_of([_episode(i) for i in range(3)])


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            {"response_lens": torch.tensor([2, 0, 4])},
            ValueError,
            r"episode 1: Episode.response_ids must hold at least one token",
        ),
        (
            {"prompt_lens": torch.tensor([1.0, 2.0, 3.0])},
            ValueError,
            r"Columns.prompt_lens must be a 1-D int64 tensor",
        ),
        (
            {"prompt_ids": torch.zeros(6, dtype=torch.int32)},
            TypeError,
            r"Columns.prompt_ids must be a 1-D torch.int64 tensor",
        ),
        (
            {"response_ids": torch.zeros(8, dtype=torch.long)},
            ValueError,
            r"Columns.response_ids must hold 9 values",
        ),
        (
            {"behavior_logprobs": torch.tensor([-1.0, -1.0, -1.0, 0.5, -1, -1, -1, -1, -1])},
            ValueError,
            r"episode 1: Episode.behavior_logprobs must be finite",
        ),
        (
            {"loss_mask": torch.tensor([True, False, False, False, False, True, True, True, True])},
            ValueError,
            r"episode 1: Episode.loss_mask must mark at least one",
        ),
        (
            {"token_advantages": torch.tensor([0.0] * 8 + [math.nan])},
            ValueError,
            r"episode 2: Episode.token_advantages must be finite",
        ),
        (
            {"advantage": torch.tensor([0.0, math.inf, 0.0], dtype=torch.float64)},
            ValueError,
            r"episode 1: Episode.advantage must be finite",
        ),
        (
            {"reward": torch.tensor([0.0, 1.0], dtype=torch.float64)},
            ValueError,
            r"Columns.reward must hold one value per episode \(3\)",
        ),
        (
            {"policy_version": torch.tensor([0, -1, 0])},
            ValueError,
            r"Episode.policy_version must be an int >= 0",
        ),
    ],
)
def test_from_columns_names_a_bad_field_and_its_episode(
    change: dict[str, torch.Tensor], error: type[Exception], message: str
) -> None:
    cols = dataclasses.replace(_good(), **change)
    with pytest.raises(error, match=message):
        EpisodeBatch.from_columns(cols)


def test_from_columns_checks_the_group_ids() -> None:
    with pytest.raises(ValueError, match="3 episodes but 2 group ids"):
        EpisodeBatch.from_columns(_good(), [0, 1])
    with pytest.raises(
        TypeError, match=r"episode 2: Episode.group_id must be an int, a str or None, got bool"
    ):
        EpisodeBatch.from_columns(_good(), [0, "a", True])
