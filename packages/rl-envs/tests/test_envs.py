"""The built-in environments, played in-process: determinism, held-out evaluation sets,
rewards in [0, 1], and the contract's errors."""

from __future__ import annotations

import pytest
from policies import Oracle
from rl_envs import (
    Action,
    ActionTypeError,
    EpisodeDoneError,
    EpisodeNotStartedError,
    FollowThePattern,
    RepeatAfterMe,
    Task,
    UnknownEnvironmentError,
    make,
    names,
    run_episode,
)
from rl_envs.environment import GeneratedEnvironment

WORD_GAMES: list[type[GeneratedEnvironment[object]]] = [RepeatAfterMe, FollowThePattern]  # type: ignore[list-item]


@pytest.mark.parametrize("cls", WORD_GAMES)
async def test_same_task_same_episode(cls: type[GeneratedEnvironment[object]]) -> None:
    a, b = cls(), cls()
    task = Task(cls.name, seed=11, level=1)
    assert await a.reset(task) == await b.reset(task)
    assert cls.content(task) == cls.content(task)
    other = {cls.content(Task(cls.name, seed=s, level=1)) for s in range(20)}
    assert len(other) > 15  # seeds really change the content


@pytest.mark.parametrize("cls", WORD_GAMES)
@pytest.mark.parametrize("level", [0, 1])
def test_eval_content_is_never_a_train_task(
    cls: type[GeneratedEnvironment[object]], level: int
) -> None:
    held_out = cls.held_out(level)
    assert len(held_out) >= cls.eval_size // 2
    assert {cls.content(t) for t in cls.eval_tasks(level)} == held_out
    train = [cls.content(Task(cls.name, seed=s, level=level)) for s in range(3000)]
    assert not held_out.intersection(train)


@pytest.mark.parametrize("name", ["repeat", "pattern"])
@pytest.mark.parametrize("level", [0, 2])
async def test_oracle_scores_one_and_mistakes_cost_their_share(name: str, level: int) -> None:
    task = Task(name, seed=5, level=level)
    perfect = await run_episode(Oracle(), make(name), task)
    assert perfect.ok
    assert perfect.done
    assert perfect.reward == pytest.approx(1.0)
    turns = perfect.turns
    assert turns == level + (2 if name == "repeat" else 3)
    assert all(0.0 <= r <= 1.0 for r in perfect.rewards)

    one_wrong = await run_episode(Oracle(wrong_on=[1]), make(name), task)
    assert one_wrong.reward == pytest.approx((turns - 1) / turns)
    assert one_wrong.rewards[1] == 0.0

    all_wrong = await run_episode(Oracle(wrong_on=range(99)), make(name), task)
    assert all_wrong.reward == 0.0
    assert all_wrong.done


async def test_pattern_gives_near_miss_credit_for_another_rules_word_when_asked() -> None:
    task = Task("pattern", seed=2)
    rules, cues = FollowThePattern.content(task)
    answers = dict(rules)
    other = next(a for c, a in rules if c != cues[0])  # a rule's word, not this cue's
    env = FollowThePattern(near_miss=0.25)
    await env.reset(task)
    assert (await env.step(Action(other))).reward == pytest.approx(0.25 / len(cues))
    assert (await env.step(Action("river-ish"))).reward == 0.0  # not a rule's word
    assert (await env.step(Action(answers[cues[2]]))).reward == pytest.approx(1 / len(cues))
    strict = FollowThePattern()  # the default game is strict
    await strict.reset(task)
    assert (await strict.step(Action(other))).reward == 0.0
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="near_miss"):
            FollowThePattern(near_miss=bad)


def test_pattern_draws_its_words_from_its_pool() -> None:
    assert len(FollowThePattern.words) == 16
    for level in range(FollowThePattern.max_level + 1):
        for seed in range(50):
            rules, cues = FollowThePattern.content(Task("pattern", seed=seed, level=level))
            words = [w for rule in rules for w in rule]
            assert len(set(words)) == len(words) == 2 * (level + 2)
            assert set(words) <= set(FollowThePattern.words)
            assert set(cues) == {cue for cue, _ in rules}

    class Fruit(FollowThePattern):
        name = "fruit-pattern"
        words = ("apple", "banana", "lemon", "orange", "pepper", "yogurt", "melon")
        max_level = 1  # three rules: six of the seven words

    rules, _ = Fruit.content(Task("fruit-pattern", seed=3, level=1))
    assert len(rules) == 3
    assert {w for rule in rules for w in rule} <= set(Fruit.words)
    assert set(Fruit.corpus()[1:]) == set(Fruit.words)  # an odd pool is fine


@pytest.mark.parametrize(
    ("words", "max_level", "problem"),
    [
        (("apple", "banana", "lemon", "orange", "pepper"), 1, r"has 5 words; max_level 1"),
        (("apple", "banana", "apple", "orange"), 0, "distinct single words"),
        (("apple", "banana", "lemon", "sour lime"), 0, "distinct single words"),
        (("apple", "banana", "lemon", " "), 0, "distinct single words"),
    ],
)
def test_a_pattern_pool_that_cannot_play_is_refused_where_it_is_defined(
    words: tuple[str, ...], max_level: int, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        type("Bad", (FollowThePattern,), {"name": "bad", "words": words, "max_level": max_level})


async def test_record_alternates_environment_and_policy() -> None:
    record = await run_episode(Oracle(), make("repeat"), Task("repeat", seed=1, level=1))
    sources = [s.source for s in record.segments]
    # The last step's observation is empty, so it is not a segment.
    assert sources == ["environment", "policy", "environment", "policy", "environment", "policy"]
    assert record.segments[0].text.startswith(RepeatAfterMe.INTRO)
    assert record.segments[1].payload == tuple(ord(c) for c in record.segments[1].text)
    assert record.segments[2].payload is None


async def test_max_turns_cuts_an_episode_without_done() -> None:
    record = await run_episode(Oracle(), make("pattern"), Task("pattern", seed=1), max_turns=2)
    assert record.ok
    assert not record.done
    assert record.turns == 2


async def test_bad_input_is_refused_before_anything_changes() -> None:
    env = RepeatAfterMe()
    with pytest.raises(EpisodeNotStartedError, match="step before reset"):
        await env.step(Action("x"))
    with pytest.raises(TypeError, match=r"expects a rl_envs\.Task"):
        await env.reset("repeat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a task for environment 'pattern' was given to 'repeat'"):
        await env.reset(Task("pattern", seed=0))
    await env.reset(Task("repeat", seed=0))
    with pytest.raises(ActionTypeError, match=r"repeat\.step expects a rl_envs\.Action, got str"):
        await env.step("banana")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Action\.text must be text"):
        Action(b"banana")  # type: ignore[arg-type]
    words = RepeatAfterMe.content(Task("repeat", seed=0))
    for word in words:
        await env.step(Action(word))
    before = await env.state()
    assert before.done
    assert before.total_reward == pytest.approx(1.0)
    with pytest.raises(EpisodeDoneError, match="step after done"):
        await env.step(Action(words[0]))
    assert await env.state() == before  # nothing recorded was lost or changed


def test_unknown_environment_and_levels() -> None:
    assert names() == ["calculator", "pattern", "repeat"]
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'nope'; known: calc"):
        make("nope")
    with pytest.raises(ValueError, match="level 7 is above max_level 6"):
        RepeatAfterMe.content(Task("repeat", seed=0, level=7))
    with pytest.raises(ValueError, match=r"Task\.seed must be an int >= 0"):
        Task("repeat", seed=-1)
    with pytest.raises(ValueError, match=r"Task\.split must be"):
        Task("repeat", seed=0, split="test")  # type: ignore[arg-type]


async def test_run_episode_refuses_a_task_for_another_environment() -> None:
    with pytest.raises(ValueError, match="a task for environment 'pattern' was given to 'repeat'"):
        await run_episode(Oracle(), make("repeat"), Task("pattern", seed=0))


async def test_a_policy_that_returns_no_policy_turn_is_an_error() -> None:
    async def bad(conversation: object) -> str:
        return "banana"

    with pytest.raises(TypeError, match=r"must return PolicyTurn\(text: str, payload\)"):
        await run_episode(bad, make("repeat"), Task("repeat", seed=0))  # type: ignore[arg-type]


def test_corpus_covers_every_word_said() -> None:
    corpus = " ".join(RepeatAfterMe.corpus() + FollowThePattern.corpus())
    for seed in range(50):
        words = RepeatAfterMe.content(Task("repeat", seed=seed, level=6))
        rules, _ = FollowThePattern.content(Task("pattern", seed=seed, level=4))
        assert all(w in corpus for w in words)
        assert all(a in corpus and b in corpus for a, b in rules)
