"""Multi-turn episodes, without Monarch: the loss mask and advantages of hand-built
episodes, the turn batcher over real (local) environments, the task source."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import pytest
from async_grpo.config.schema import EnvConfig
from async_grpo.controller.evaluation import score_env_eval
from async_grpo.generation.decoding import Completion
from async_grpo.generation.episodes import records_to_episodes
from async_grpo.generation.multiturn import TurnBatcher, policy_text, policy_version
from async_grpo.grpo.batching import pack
from async_grpo.tasks.environments import (
    TaskSource,
    check_env_config,
    mean_by_env,
    parse_env_weights,
)
from rl_envs import (
    EpisodeError,
    EpisodeRecord,
    FollowThePattern,
    PolicyTurn,
    RepeatAfterMe,
    Segment,
    Task,
    run_episode,
)


def encode(text: str) -> list[int]:
    """A toy encoding: each character of the environment's text is one token (its code point)."""
    return [ord(ch) for ch in text]


def turn(ids: list[int], logprobs: list[float], version: int, text: str = "w") -> Completion:
    return Completion("", text, [], ids, logprobs, finished=True, policy_version=version)


def record(
    reward_turns: Sequence[tuple[Completion, float, str]], first: str = "ab"
) -> EpisodeRecord[Completion]:
    """An episode: observation `first`, then per turn (the policy's turn, its reward, the
    environment's answer)."""
    segments: list[Segment[Completion]] = [Segment("environment", first)]
    for comp, reward, answer in reward_turns:
        segments.append(Segment("policy", comp.text, comp, reward))
        if answer:
            segments.append(Segment("environment", answer))
    return EpisodeRecord(Task("repeat", 0), tuple(segments), done=True)


def test_loss_mask_covers_exactly_the_policy_tokens() -> None:
    # prompt "ab" | policy [7, 8] | env "c" | policy [9] | env "de" (after the last turn: cut)
    rec = record([(turn([7, 8], [-0.5, -0.25], 3), 0.5, "c"), (turn([9], [-1.0], 2), 0.25, "de")])
    other = record([(turn([5], [-2.0], 4), 0.0, "c"), (turn([6], [-0.1], 4), 0.0, "")])
    episodes, dropped = records_to_episodes([[rec, other]], itertools.count(7), encode)
    assert dropped == 0
    e = episodes[0]
    assert e.prompt_ids.tolist() == [ord("a"), ord("b")]
    assert e.response_ids.tolist() == [7, 8, ord("c"), 9]
    assert e.loss_mask is not None
    assert e.loss_mask.tolist() == [True, True, False, True]
    assert e.behavior_logprobs.tolist() == [-0.5, -0.25, 0.0, -1.0]
    assert e.reward == pytest.approx(0.75)
    assert e.policy_version == 2  # the oldest version that sampled a turn
    assert e.group_id == 7
    assert episodes[1].group_id == 7
    # Two episodes, returns 0.75 and 0: mean 0.375, std 0.375, advantages +1 and -1.
    assert [x.advantage for x in episodes] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert episodes[1].loss_mask is not None
    assert episodes[1].loss_mask.tolist() == [True, False, True]


def test_turn_credit_puts_each_turns_advantage_on_its_tokens() -> None:
    # prompt "ab" | policy [7, 8] (reward 1) | env "c" | policy [9] (reward 0)
    rec = record([(turn([7, 8], [-0.5, -0.25], 3), 1.0, "c"), (turn([9], [-1.0], 3), 0.0, "")])
    # prompt "ab" | policy [5] (reward 0) | env "c" | policy [6] (reward 1)
    other = record([(turn([5], [-2.0], 3), 0.0, "c"), (turn([6], [-0.1], 3), 1.0, "")])
    episodes, _ = records_to_episodes(
        [[rec, other]], itertools.count(), encode, scale="none", turn_discount=0.0
    )
    first, second = episodes
    # Discount 0, unscaled: turn 0 rewards 1, 0 -> +0.5, -0.5; turn 1: 0, 1 -> -0.5, +0.5.
    # Environment tokens carry 0.0.
    assert first.token_advantages is not None
    assert first.token_advantages.tolist() == [0.5, 0.5, 0.0, -0.5]
    assert second.token_advantages is not None
    assert second.token_advantages.tolist() == [-0.5, 0.0, 0.5]
    # Equal returns (1 and 1): the episode-level advantage says nothing, the turns do.
    assert [e.advantage for e in episodes] == [0.0, 0.0]
    # Without a discount given, every turn gets the episode's advantage.
    plain, _ = records_to_episodes([[rec, other]], itertools.count(), encode)
    assert [e.token_advantages for e in plain] == [None, None]


def test_pack_spreads_per_token_advantages() -> None:
    rec = record([(turn([7, 8], [-0.5, -0.25], 3), 1.0, "c"), (turn([9], [-1.0], 3), 0.0, "")])
    other = record([(turn([5], [-2.0], 3), 0.0, "c"), (turn([6], [-0.1], 3), 0.5, "")])
    per_turn, _ = records_to_episodes(
        [[rec, other]], itertools.count(), encode, scale="none", turn_discount=0.0
    )
    batch = pack(per_turn, pad_id=0)
    assert batch.advantages.tolist() == [[0.5, 0.5, 0.0, -0.25], [-0.5, 0.0, 0.25, 0.0]]
    # Episodes without per-token advantages: one per row ([B]); mixed: rows broadcast.
    plain, _ = records_to_episodes([[rec, other]], itertools.count(), encode, scale="none")
    assert pack(plain, pad_id=0).advantages.tolist() == [0.25, -0.25]
    mixed = pack([plain[0], per_turn[1]], pad_id=0).advantages
    assert mixed.tolist() == [[0.25, 0.25, 0.25, 0.25], [-0.5, 0.0, 0.25, 0.0]]


def test_a_group_with_a_failed_episode_is_dropped_whole() -> None:
    ok = record([(turn([1], [-1.0], 0), 1.0, "")])
    failed = EpisodeRecord[Completion](
        Task("repeat", 1), error=EpisodeError("replica_died", "gone", 1)
    )
    good_group = [ok, ok]
    episodes, dropped = records_to_episodes([[ok, failed], good_group], itertools.count(), encode)
    assert dropped == 2
    assert len(episodes) == 2
    assert {e.group_id for e in episodes} == {0}
    # Equal returns: exactly zero advantage.
    assert [e.advantage for e in episodes] == [0.0, 0.0]
    assert records_to_episodes([[failed, failed]], itertools.count(), encode) == ([], 2)


def test_groups_of_different_sizes_are_refused() -> None:
    ok = record([(turn([1], [-1.0], 0), 1.0, "")])
    with pytest.raises(ValueError, match="same number of episodes"):
        records_to_episodes([[ok, ok], [ok]], itertools.count(), encode)


def test_episode_helpers() -> None:
    rec = record([(turn([1], [-1.0], 5, "x"), 0.5, "c"), (turn([2], [-1.0], 4, "y"), 0.5, "")])
    assert policy_version(rec) == 4
    assert policy_text(rec) == "x | y"


class FakeGenerator:
    """Answers each context with a fixed word; records the batch sizes it was asked for."""

    def __init__(self, answer: str, fail: bool = False) -> None:
        self.answer, self.fail = answer, fail
        self.batches: list[int] = []
        self.contexts: list[list[int]] = []

    async def __call__(self, contexts: list[list[int]]) -> list[Completion]:
        await asyncio.sleep(0.001)
        if self.fail:
            raise RuntimeError("the generator fell over")
        self.batches.append(len(contexts))
        self.contexts += contexts
        return [turn([len(c)], [-0.1], 0, self.answer) for c in contexts]


def test_turn_batcher_samples_every_turn_of_all_episodes_in_batches() -> None:
    # Episodes of different lengths (levels 0, 1, 2: 2, 3, 4 words): the batch shrinks as
    # episodes end, and nothing waits on an episode that is over.
    tasks = [Task("repeat", seed=s, level=s % 3) for s in range(6)]
    gen = FakeGenerator("apple")

    async def main() -> list[EpisodeRecord[Completion]]:
        batcher = TurnBatcher(gen, encode, len(tasks))

        async def one(task: Task) -> EpisodeRecord[Completion]:
            try:
                return await run_episode(batcher, RepeatAfterMe(), task)
            finally:
                batcher.finished()

        return list(await asyncio.wait_for(asyncio.gather(*(one(t) for t in tasks)), 10))

    records = asyncio.run(main())
    assert [r.turns for r in records] == [2, 3, 4, 2, 3, 4]
    assert gen.batches == [6, 6, 4, 2]
    # Each context is the conversation so far: the first is the first observation alone.
    first_obs = records[0].segments[0].text
    assert gen.contexts[0] == encode(first_obs)


def test_turn_batcher_passes_a_generator_failure_to_every_episode() -> None:
    gen = FakeGenerator("apple", fail=True)

    async def main() -> list[BaseException | EpisodeRecord[Completion]]:
        batcher = TurnBatcher(gen, encode, 3)

        async def one(seed: int) -> EpisodeRecord[Completion]:
            try:
                return await run_episode(batcher, RepeatAfterMe(), Task("repeat", seed))
            finally:
                batcher.finished()

        return list(
            await asyncio.wait_for(
                asyncio.gather(*(one(s) for s in range(3)), return_exceptions=True), 10
            )
        )

    results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and "fell over" in str(r) for r in results)


def test_a_right_answer_policy_gets_full_return_through_the_batcher() -> None:
    # The batcher's turn text is what the environment reads: a policy that always answers
    # the expected word scores 1.0 on "follow the pattern".
    async def main() -> EpisodeRecord[Completion]:
        env = FollowThePattern()
        rules: dict[str, str] = {}

        async def generate(contexts: list[list[int]]) -> list[Completion]:
            return [turn([1], [-0.1], 0, rules[env_cue[0]]) for _ in contexts]

        env_cue: list[str] = [""]
        task = Task("pattern", seed=3)
        (pairs, _) = FollowThePattern.content(task)
        rules.update(dict(pairs))

        batcher = TurnBatcher(generate, encode, 1)

        async def policy(conversation: Sequence[Segment[Completion]]) -> PolicyTurn[Completion]:
            env_cue[0] = conversation[-1].text.split("\n")[-1]
            return await batcher(conversation)

        return await run_episode(policy, env, task)

    rec = asyncio.run(main())
    assert rec.ok
    assert rec.done
    assert rec.reward == pytest.approx(1.0)


def test_env_weights_parse_and_refuse_bad_specs() -> None:
    assert parse_env_weights("pattern") == {"pattern": 1.0}
    assert parse_env_weights("repeat:1, pattern:2") == {"repeat": 1.0, "pattern": 2.0}
    for spec, problem in [
        ("chess", "unknown environment 'chess'; known: calculator, pattern, repeat"),
        ("repeat:x", "bad weight 'x'"),
        ("repeat:-1", "finite and >= 0"),
        ("repeat:0", "at least one weight must be > 0"),
        ("repeat,repeat", "named twice"),
        ("repeat,", "an empty environment name"),
    ]:
        with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
            parse_env_weights(spec)
    with pytest.raises(ValueError, match=r"env\.level 5 is above the top level of 'pattern' \(4\)"):
        check_env_config(EnvConfig(tasks="pattern", level=5), eval_prompts=8)


def test_task_source_is_deterministic_and_follows_the_curriculum() -> None:
    cfg = EnvConfig(tasks="repeat:1,pattern:3", curriculum=0.8)
    a, b = TaskSource(cfg, seed=4), TaskSource(cfg, seed=4)
    drawn = a.draw(400)
    assert drawn == b.draw(400)
    share = sum(t.env == "pattern" for t in drawn) / len(drawn)
    assert 0.68 < share < 0.82  # weight 3 of 4
    assert {t.level for t in drawn} == {0}
    assert {t.split for t in drawn} == {"train"}
    evals = a.eval_tasks(2)
    assert [(t.env, t.seed, t.split) for t in evals] == [
        ("repeat", 0, "eval"), ("repeat", 1, "eval"), ("pattern", 0, "eval"), ("pattern", 1, "eval")
    ]  # fmt: skip
    # A passing evaluation promotes that environment only.
    changes = a.report(mean_by_env(evals, [0.9, 0.9, 0.5, 0.7]))
    assert [(name, c.level) for name, c in changes] == [("repeat", 0)]
    assert a.levels == {"repeat": 1, "pattern": 0}
    assert {t.level for t in a.draw(50) if t.env == "repeat"} == {1}
    # Without a curriculum the level stays, whatever the score.
    fixed = TaskSource(EnvConfig(tasks="repeat", level=2), seed=0)
    assert fixed.report({"repeat": 1.0}) == []
    assert fixed.levels == {"repeat": 2}


def test_mean_by_env() -> None:
    tasks = [Task("repeat", 0), Task("pattern", 0), Task("repeat", 1)]
    assert mean_by_env(tasks, [1.0, 0.5, 0.0]) == {"repeat": 0.5, "pattern": 0.5}


def test_env_eval_scores_completed_episodes_and_skips_failed_tasks() -> None:
    def played(env: str, reward: float, version: int) -> EpisodeRecord[Completion]:
        segments: list[Segment[Completion]] = [
            Segment("environment", "go"),
            Segment("policy", "w", turn([1], [-1.0], version), reward),
        ]
        return EpisodeRecord(Task(env, 0, "eval"), tuple(segments), done=True)

    failed = EpisodeRecord[Completion](
        Task("pattern", 1, "eval"), error=EpisodeError("replica_died", "gone", 0)
    )
    tasks = [Task("repeat", 0, "eval"), Task("pattern", 0, "eval"), Task("pattern", 1, "eval")]
    groups = [
        [played("repeat", 1.0, 4), played("repeat", 0.5, 3)],  # task score 0.75
        [played("pattern", 0.25, 5), failed],  # the completed one only: 0.25
        [failed, failed],  # nothing completed: left out, not scored 0
    ]
    scored = score_env_eval(7, tasks, groups)
    assert scored is not None
    result, by_env = scored
    assert result.step == 7
    assert result.version == 3
    assert result.reward == pytest.approx(0.5)  # (0.75 + 0.25) / 2 tasks
    assert result.exact == pytest.approx(1 / 3)  # one full return among 3 completed
    assert [label for label, _ in result.per_prompt] == ["repeat L0 #0", "pattern L0 #0"]
    assert by_env == pytest.approx({"repeat": 0.75, "pattern": 0.25})
    assert score_env_eval(7, tasks[2:], groups[2:]) is None
