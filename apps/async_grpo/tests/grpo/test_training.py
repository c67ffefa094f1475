"""The pure pieces around a train step: schedule, data-parallel slicing and normalisation,
evaluation scoring and batch diagnostics."""

import itertools
import math
import pickle

import pytest
import torch
from async_grpo.config.schema import LossConfig, TrainerConfig
from async_grpo.generation.decoding import Completion
from async_grpo.grpo.loss import grpo_loss
from async_grpo.grpo.step import add_stats, learning_rate, rank_rows
from async_grpo.observability.batch_stats import batch_diagnostics
from async_grpo.observability.scoring import score_eval
from async_grpo.tasks.prompts import Sample, eval_set
from replay_buffer import Episode, EpisodeBatch


def test_constant_schedule() -> None:
    cfg = TrainerConfig(lr=1e-3)
    assert [learning_rate(cfg, s, 10) for s in (0, 5, 9, 50)] == [1e-3] * 4


def test_cosine_schedule_hand_computed() -> None:
    cfg = TrainerConfig(lr=1.0, lr_schedule="cosine", warmup_steps=4, min_lr_ratio=0.1)
    total = 13  # warm-up on steps 0..3, cosine over steps 4..12
    lrs = [learning_rate(cfg, s, total) for s in range(total)]
    assert lrs[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert lrs[8] == pytest.approx(0.1 + 0.9 * 0.5)  # half-way: cos(pi/2) = 0
    assert lrs[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lrs[12] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:]))
    assert learning_rate(cfg, total + 100, total) == pytest.approx(0.1)  # stays at the floor


def test_rank_rows_are_contiguous_whole_groups_covering_the_batch() -> None:
    parts = [rank_rows(5 * 3, 3, r, 2) for r in range(2)]  # 5 groups of 3 over 2 ranks
    assert parts == [slice(0, 9), slice(9, 15)]  # 3 groups, then 2
    with pytest.raises(ValueError, match="at least 3 whole groups"):
        rank_rows(2 * 3, 3, 0, 3)
    with pytest.raises(ValueError, match="whole groups"):
        rank_rows(7, 3, 0, 2)


def test_ranks_losses_add_up_to_the_whole_batch() -> None:
    torch.manual_seed(0)
    lp, old = torch.randn(4, 3) * 0.1 - 1, torch.randn(4, 3) * 0.1 - 1
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.float)
    cfg = LossConfig()
    whole, whole_stats = grpo_loss(lp, old, adv, mask, cfg)
    total = float(mask.sum())
    parts = [
        grpo_loss(lp[i], old[i], adv[i], mask[i], cfg, token_count=total)
        for i in (slice(0, 2), slice(2, 4))
    ]
    assert sum(float(p[0]) for p in parts) == pytest.approx(float(whole))
    merged = add_stats([p[1] for p in parts])
    assert merged.tokens == whole_stats.tokens
    assert merged.ratio_mean == pytest.approx(whole_stats.ratio_mean)
    assert merged.clip_frac == pytest.approx(whole_stats.clip_frac)
    with pytest.raises(ValueError, match="token_count"):
        grpo_loss(lp, old, adv, mask, cfg, token_count=0)


def test_eval_set_covers_every_n_once() -> None:
    prompts = [s.prompt for s in eval_set("count", 2, 5)]
    assert prompts == ["count to 2:", "count to 3:", "count to 4:", "count to 5:"]
    assert len(eval_set("arithmetic", 2, 9, size=5)) == 5
    assert eval_set("arithmetic", 2, 9) == eval_set("arithmetic", 2, 9)  # a fixed set
    data = [Sample(f"p{i}", "t") for i in range(20)]
    assert eval_set("count", 1, 6, data, size=3) == data[:3]


def completion(text: str, version: int = 7) -> Completion:
    return Completion("p", text, [1], [2], [-0.5], True, version)


def test_score_eval_weighs_every_prompt_the_same() -> None:
    prompts = [Sample("count to 1:", "1"), Sample("count to 2:", "1 2")]
    groups = [[completion("1"), completion("1")], [completion("1 2"), completion("1", 6)]]
    result = score_eval(40, prompts, groups, [1.0, 1.0, 1.0, 0.5])
    assert result.per_prompt == (("count to 1:", 1.0), ("count to 2:", 0.75))
    assert result.reward == pytest.approx(0.875)
    assert result.exact == pytest.approx(0.75)
    assert (result.step, result.version) == (40, 6)


def test_batch_diagnostics() -> None:
    def episode(
        reward: float, advantage: float, logprobs: list[float], per_token: list[float] | None = None
    ) -> Episode:
        return Episode(
            prompt_ids=torch.tensor([1]),
            response_ids=torch.tensor([2] * len(logprobs)),
            behavior_logprobs=torch.tensor(logprobs),
            reward=reward,
            advantage=advantage,
            policy_version=0,
            group_id=0,
            token_advantages=None if per_token is None else torch.tensor(per_token),
        )

    batch = [
        episode(1.0, 0.0, [-1.0]),
        episode(1.0, 0.0, [-1.0, -1.0]),
        episode(0.0, -1.0, [0.0]),
        episode(1.0, 1.0, [0.0]),
    ]
    uniform, logprob = batch_diagnostics(batch, group_size=2)
    assert uniform == 0.5  # the first group's rewards are equal, the second's are not
    assert logprob == pytest.approx(-3.0 / 5)
    # Per-turn credit: equal returns, but the turns differ, so the group still teaches.
    turns = [
        episode(1.0, 0.0, [-1.0, -1.0], [1.0, -1.0]),
        episode(1.0, 0.0, [-1.0, -1.0], [-1.0, 1.0]),
    ]
    flat = [episode(1.0, 0.0, [-1.0], [0.0]), episode(1.0, 0.0, [-1.0], [0.0])]
    assert batch_diagnostics(turns + flat, group_size=2)[0] == 0.5
    # The same from a batch as it arrives from the buffer (one record, read field by field).
    mixed = turns + flat + batch
    record = pickle.loads(pickle.dumps(EpisodeBatch(mixed)))
    assert batch_diagnostics(record, group_size=2) == pytest.approx(
        batch_diagnostics(mixed, group_size=2)
    )
    assert batch_diagnostics(mixed, group_size=2) == pytest.approx((0.5, -9.0 / 11))
