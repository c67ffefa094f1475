"""Episode validation: every malformed field is refused with an error naming it."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest
import torch
from replay_buffer import Episode
from replay_buffer.testing import make_episode


def fields(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "prompt_ids": torch.tensor([1, 2, 3]),
        "response_ids": torch.tensor([4, 5]),
        "behavior_logprobs": torch.tensor([-0.1, -2.0]),
        "reward": 1.0,
        "advantage": 0.5,
        "policy_version": 3,
    }
    base.update(overrides)
    return base


def test_valid_episode_keeps_its_fields() -> None:
    e = Episode(**fields(group_id="g", metadata={"task": "count"}))
    assert e.prompt_ids.tolist() == [1, 2, 3]
    assert e.response_ids.tolist() == [4, 5]
    assert e.behavior_logprobs.dtype is torch.float32
    assert (e.reward, e.advantage, e.policy_version) == (1.0, 0.5, 3)
    assert e.group_id == "g"
    assert e.metadata == {"task": "count"}
    assert e.num_tokens == 5


def test_int_reward_is_stored_as_float() -> None:
    e = Episode(**fields(reward=1, advantage=-2))
    assert type(e.reward) is float
    assert e.reward == 1.0
    assert type(e.advantage) is float
    assert e.advantage == -2.0


def test_fields_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        Episode(torch.tensor([1]), torch.tensor([1]), torch.tensor([-1.0]), 0.0, 0.0, 0)  # type: ignore[call-arg]
    e = make_episode()
    with pytest.raises(AttributeError):
        e.policy_version = 5  # type: ignore[misc]


def test_equality_is_identity() -> None:
    a, b = make_episode(), make_episode()
    assert a == a  # noqa: PLR0124
    assert a != b


def test_pickle_round_trip_is_exact() -> None:
    e = Episode(
        **fields(
            prompt_ids=torch.arange(10)[::3],  # a non-contiguous view
            response_ids=torch.tensor([2**40, -7]),
            behavior_logprobs=torch.tensor([-1e-30, -123.456]),
            group_id=7,
            metadata={"k": [1, 2]},
        )
    )
    back = pickle.loads(pickle.dumps(e))
    for name in ("prompt_ids", "response_ids", "behavior_logprobs"):
        original, copy = getattr(e, name), getattr(back, name)
        assert copy.dtype == original.dtype
        assert torch.equal(copy, original)
    assert (back.reward, back.advantage, back.policy_version) == (1.0, 0.5, 3)
    assert (back.group_id, back.metadata) == (7, {"k": [1, 2]})
    back.prompt_ids[0] = 99  # the copy owns writable memory of its own
    assert e.prompt_ids[0] == 0


BAD_FIELDS = [
    # (overrides, exception type, words the message must contain)
    ({"prompt_ids": [1, 2]}, TypeError, "prompt_ids must be a torch.Tensor"),
    ({"prompt_ids": torch.tensor([[1, 2]])}, ValueError, "prompt_ids must be 1-D"),
    ({"prompt_ids": torch.tensor([1, 2], dtype=torch.int32)}, TypeError, "prompt_ids must have"),
    ({"prompt_ids": torch.tensor([], dtype=torch.long)}, ValueError, "prompt_ids must hold"),
    ({"response_ids": torch.tensor([4.0, 5.0])}, TypeError, "response_ids must have dtype"),
    ({"response_ids": torch.tensor(4)}, ValueError, "response_ids must be 1-D"),
    (
        {"response_ids": torch.tensor([], dtype=torch.long), "behavior_logprobs": torch.zeros(0)},
        ValueError,
        "response_ids must hold at least one token",
    ),
    ({"behavior_logprobs": (-0.1, -0.2)}, TypeError, "behavior_logprobs must be a torch.Tensor"),
    ({"behavior_logprobs": torch.tensor([-0.1])}, ValueError, "one value per response token (2)"),
    (
        {"behavior_logprobs": torch.tensor([[-0.1, -0.2]])},
        ValueError,
        "behavior_logprobs must be 1-D",
    ),
    (
        {"behavior_logprobs": torch.tensor([-0.1, -0.2], dtype=torch.float64)},
        TypeError,
        "behavior_logprobs must have dtype torch.float32",
    ),
    ({"behavior_logprobs": torch.tensor([-0.1, math.nan])}, ValueError, "behavior_logprobs"),
    ({"behavior_logprobs": torch.tensor([-math.inf, -0.1])}, ValueError, "min=-inf"),
    ({"behavior_logprobs": torch.tensor([-0.1, 0.3])}, ValueError, "max=0.3"),
    (
        {"behavior_logprobs": torch.tensor([-0.1, -0.2], requires_grad=True)},
        ValueError,
        "must not require grad",
    ),
    ({"reward": math.nan}, ValueError, "Episode.reward must be finite"),
    ({"reward": math.inf}, ValueError, "Episode.reward must be finite"),
    ({"reward": 10**400}, ValueError, "Episode.reward must be finite"),
    ({"reward": True}, TypeError, "Episode.reward must be a float"),
    ({"reward": torch.tensor(1.0)}, TypeError, "Episode.reward must be a float, got Tensor"),
    ({"advantage": -math.inf}, ValueError, "Episode.advantage must be finite"),
    ({"advantage": "1"}, TypeError, "Episode.advantage must be a float"),
    ({"policy_version": -1}, ValueError, "Episode.policy_version must be >= 0"),
    ({"policy_version": 1.0}, TypeError, "Episode.policy_version must be an int"),
    ({"policy_version": True}, TypeError, "Episode.policy_version must be an int"),
    ({"group_id": 1.5}, TypeError, "Episode.group_id must be an int, a str or None"),
    ({"group_id": False}, TypeError, "Episode.group_id"),
    ({"metadata": [("a", 1)]}, TypeError, "Episode.metadata must be a dict"),
    ({"loss_mask": [True, False]}, TypeError, "Episode.loss_mask must be a torch.Tensor"),
    ({"loss_mask": torch.tensor([1, 0])}, TypeError, "loss_mask must have dtype torch.bool"),
    ({"loss_mask": torch.tensor([True])}, ValueError, "one value per response token (2), got 1"),
    ({"loss_mask": torch.tensor([False, False])}, ValueError, "at least one policy token"),
    ({"token_advantages": [1.0, 0.0]}, TypeError, "Episode.token_advantages must be a torch"),
    ({"token_advantages": torch.tensor([1, 0])}, TypeError, "must have dtype torch.float32"),
    ({"token_advantages": torch.tensor([1.0])}, ValueError, "per response token (2), got 1"),
    ({"token_advantages": torch.tensor([1.0, math.nan])}, ValueError, "must be finite"),
    ({"token_advantages": torch.tensor([1.0, -math.inf])}, ValueError, "must be finite"),
    (
        {"token_advantages": torch.tensor([1.0, 0.0], requires_grad=True)},
        ValueError,
        "token_advantages must not require grad",
    ),
]


@pytest.mark.parametrize(("overrides", "error", "message"), BAD_FIELDS)
def test_bad_field_is_refused_by_name(
    overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        Episode(**fields(**overrides))
    assert message in str(info.value)


def test_logprobs_equal_to_zero_are_valid_and_the_bound_is_exactly_zero() -> None:
    # A token sampled with probability 1 has log-probability exactly 0.
    e = Episode(**fields(behavior_logprobs=torch.tensor([0.0, -0.0])))
    assert e.behavior_logprobs.tolist() == [0.0, 0.0]
    assert torch.signbit(e.behavior_logprobs).tolist() == [False, True]  # kept as given
    # The smallest positive float32 (a subnormal) is already out of range.
    tiny = torch.nextafter(torch.zeros(1), torch.ones(1))
    assert tiny.item() > 0.0
    with pytest.raises(ValueError, match=r"behavior_logprobs must be .*\(<= 0\), got min=0\.0"):
        Episode(**fields(behavior_logprobs=torch.cat([torch.zeros(1), tiny])))


def test_loss_mask_marks_the_policy_tokens_and_survives_pickle() -> None:
    # A multi-turn response: policy, environment, environment, policy.
    mask = torch.tensor([True, False, False, True])
    e = Episode(
        **fields(
            response_ids=torch.tensor([4, 5, 6, 7]),
            behavior_logprobs=torch.tensor([-0.5, 0.0, 0.0, -1.5]),
            loss_mask=mask,
        )
    )
    assert e.num_policy_tokens == 2
    assert make_episode().num_policy_tokens == len(make_episode().response_ids)
    back = pickle.loads(pickle.dumps(e))
    assert back.loss_mask is not None
    assert back.loss_mask.dtype == torch.bool
    assert back.loss_mask.tolist() == [True, False, False, True]
    assert pickle.loads(pickle.dumps(make_episode())).loss_mask is None


def test_token_advantages_survive_pickle() -> None:
    e = Episode(
        **fields(
            response_ids=torch.tensor([4, 5, 6]),
            behavior_logprobs=torch.tensor([-0.5, 0.0, -1.5]),
            loss_mask=torch.tensor([True, False, True]),
            token_advantages=torch.tensor([1.25, 0.0, -0.75]),
        )
    )
    back = pickle.loads(pickle.dumps(e))
    assert back.token_advantages is not None
    assert back.token_advantages.dtype == torch.float32
    assert back.token_advantages.tolist() == [1.25, 0.0, -0.75]
    assert pickle.loads(pickle.dumps(make_episode())).token_advantages is None
