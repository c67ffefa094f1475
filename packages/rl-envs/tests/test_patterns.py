"""The data-side patterns (task mixtures, curriculum, evaluation) and the token
view of an episode."""

from __future__ import annotations

from collections import Counter

import pytest
from policies import Oracle, Payload
from rl_envs import (
    Curriculum,
    EpisodeRecord,
    RepeatAfterMe,
    Segment,
    Task,
    TaskMixture,
    context_ids,
    evaluate,
    make,
    run_episode,
    tokenize_episode,
)
from rl_envs.episode import EpisodeError


def test_mixture_draws_by_weight_deterministically() -> None:
    mixture = TaskMixture({"repeat": 3.0, "pattern": 1.0, "calculator": 0.0}, seed=7)
    tasks = [mixture.sample(levels={"repeat": 2}) for _ in range(4000)]
    counts = Counter(t.env for t in tasks)
    assert counts["calculator"] == 0
    assert 0.72 < counts["repeat"] / 4000 < 0.78
    assert {t.level for t in tasks if t.env == "repeat"} == {2}
    assert {t.level for t in tasks if t.env == "pattern"} == {0}
    assert all(t.split == "train" for t in tasks)
    assert len({t.seed for t in tasks}) > 3900
    again = TaskMixture({"repeat": 3.0, "pattern": 1.0, "calculator": 0.0}, seed=7)
    assert [again.sample(levels={"repeat": 2}) for _ in range(4000)] == tasks
    assert mixture.fractions() == {"repeat": 0.75, "pattern": 0.25, "calculator": 0.0}


def test_mixture_resumes_from_its_state() -> None:
    mixture = TaskMixture({"repeat": 1.0, "pattern": 1.0}, seed=1)
    for _ in range(10):
        mixture.sample()
    state = mixture.state_dict()
    expected = [mixture.sample() for _ in range(20)]
    resumed = TaskMixture({"repeat": 1.0, "pattern": 1.0}, seed=99)
    resumed.load_state_dict(state)
    assert [resumed.sample() for _ in range(20)] == expected
    assert resumed.drawn == mixture.drawn


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({}, "non-empty mapping"),
        ({"repeat": -1.0}, "weight of 'repeat' must be in"),
        ({"repeat": float("nan")}, "must be a finite number"),
        ({"repeat": 0.0}, "needs a weight > 0"),
        ({"": 1.0}, "environment name must be a non-empty str"),
    ],
)
def test_mixture_rejects_bad_weights(weights: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TaskMixture(weights)


def test_curriculum_advances_on_passing_evaluations() -> None:
    curriculum = Curriculum(max_level=2, threshold=0.8, patience=2)
    assert not curriculum.report(0.9)  # one pass is not enough with patience 2
    assert not curriculum.report(0.5)  # and a failure resets the count
    assert not curriculum.report(0.85)
    assert curriculum.report(0.95)
    assert curriculum.level == 1
    assert curriculum.report(0.8) is False
    assert curriculum.report(1.0)
    assert curriculum.level == 2
    assert curriculum.finished
    assert not curriculum.report(1.0)
    assert curriculum.report(1.0) is False
    assert curriculum.level == 2  # never past max_level
    assert [(c.level, c.score) for c in curriculum.history] == [(0, 0.95), (1, 1.0)]
    with pytest.raises(ValueError, match=r"Curriculum score must be in \[0.0, 1.0\]"):
        curriculum.report(1.5)
    with pytest.raises(ValueError, match="threshold must be > 0"):
        Curriculum(max_level=1, threshold=0)
    with pytest.raises(ValueError, match="start 3 is above max_level 1"):
        Curriculum(max_level=1, start=3)


async def test_evaluate_drives_the_curriculum() -> None:
    curriculum = Curriculum(max_level=RepeatAfterMe.max_level, threshold=0.9)
    good, _ = await evaluate(Oracle(), RepeatAfterMe, RepeatAfterMe.eval_tasks(curriculum.level))
    assert good.episodes == RepeatAfterMe.eval_size
    assert good.mean_reward == pytest.approx(1.0)
    assert good.success_rate == 1.0
    assert curriculum.report(good.mean_reward)
    tasks = RepeatAfterMe.eval_tasks(curriculum.level)
    poor, records = await evaluate(Oracle(wrong_on=[0]), RepeatAfterMe, tasks)
    assert poor.mean_reward == pytest.approx(2 / 3)  # level 1: 3 words, the first wrong
    assert poor.success_rate == 0.0
    assert not curriculum.report(poor.mean_reward)
    assert [r.task for r in records] == tasks


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character, offset so it differs from payloads."""
    return [1000 + ord(c) for c in text]


def ids_of(payload: Payload) -> Payload:
    return payload


def logprobs_of(payload: Payload) -> list[float]:
    return [-0.5] * len(payload)


async def test_tokenized_episode_masks_environment_tokens() -> None:
    record = await run_episode(Oracle(), make("repeat"), Task("repeat", seed=3, level=1))
    view = tokenize_episode(record, encode=encode, token_ids=ids_of, logprobs=logprobs_of)
    first, w1, obs1, w2, obs2, w3 = record.segments
    assert view.prompt_ids == encode(first.text)
    assert w1.payload is not None
    assert w2.payload is not None
    assert w3.payload is not None
    # Every policy turn's tokens, with the environment's words between them; nothing after
    # the last turn.
    assert view.response_ids == [
        *w1.payload, *encode(obs1.text), *w2.payload, *encode(obs2.text), *w3.payload
    ]  # fmt: skip
    n1, e1, n2, e2, n3 = map(len, (w1.payload, encode(obs1.text), w2.payload,
                                   encode(obs2.text), w3.payload))  # fmt: skip
    assert view.policy_mask == [True] * n1 + [False] * e1 + [True] * n2 + [False] * e2 + [True] * n3
    assert view.behavior_logprobs == [-0.5 if m else 0.0 for m in view.policy_mask]
    assert view.turns == [0] * n1 + [-1] * e1 + [1] * n2 + [-1] * e2 + [2] * n3
    assert view.reward == pytest.approx(1.0)
    # The policy's generation context is built the same way.
    assert context_ids(record.segments[:3], encode=encode, token_ids=ids_of) == (
        view.prompt_ids + view.response_ids[: n1 + e1]
    )


def test_failed_and_inconsistent_episodes_have_no_token_view() -> None:
    failed: EpisodeRecord[Payload] = EpisodeRecord(
        Task("repeat", seed=0), error=EpisodeError("replica_died", "gone", 1)
    )
    with pytest.raises(ValueError, match="failed episode"):
        tokenize_episode(failed, encode=encode, token_ids=ids_of, logprobs=logprobs_of)
    with pytest.raises(ValueError, match="holds no segments"):
        EpisodeRecord(
            Task("repeat", seed=0),
            (Segment("environment", "x"),),
            error=EpisodeError("timeout", "slow", 0),
        )
    mismatched: EpisodeRecord[Payload] = EpisodeRecord(
        Task("repeat", seed=0),
        (Segment("environment", "say a"), Segment("policy", "a", (1, 2), 1.0)),
        done=True,
    )
    with pytest.raises(ValueError, match="policy turn 1: 2 token ids but 1 log-probs"):
        tokenize_episode(mismatched, encode=encode, token_ids=ids_of, logprobs=lambda p: [-1.0])
