"""`trainer.merge_identical`: identical episodes of a step take one row, their tokens weighted
by their number, and the step is the one a row per episode gives. And the reference model's
pass (`sequence_logprobs_in_passes`): each distinct episode once, every row's log-probs."""

import dataclasses
from pathlib import Path

import pytest
import torch
from async_grpo.config.schema import LossConfig, SamplingConfig, TrainerConfig
from async_grpo.grpo.batching import (
    distinct_sequences,
    identical_rows,
    pack,
    sequence_logprobs,
    sequence_logprobs_in_passes,
)
from async_grpo.grpo.loss import grpo_loss
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.policy import load_policy, load_tokenizer
from replay_buffer import Episode


def episode(
    prompt: list[int], response: list[int], advantage: float = 1.0, lp: float = -0.5, group: int = 0
) -> Episode:
    return Episode(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(response),
        behavior_logprobs=torch.full((len(response),), lp),
        reward=advantage,
        advantage=advantage,
        policy_version=0,
        group_id=group,
    )


def test_the_first_of_each_set_of_equal_rows_and_how_many_it_stands_for() -> None:
    eps = [
        episode([2, 3], [4, 5]),  # 0
        episode([2, 3], [4]),  # 1: a prefix of 0's response, not equal
        episode([2, 3], [4, 5]),  # 2 = 0
        episode([2, 3], [4, 5], lp=-0.25),  # 3: 0's tokens, other log-probs
        episode([2, 3], [4, 5], advantage=-1.0),  # 4: 0's tokens, another advantage
        episode([2, 3], [4]),  # 5 = 1
        episode([2, 3], [4, 5]),  # 6 = 0
        episode([2], [3, 4, 5]),  # 7: the same tokens end to end, another prompt
    ]
    batch = pack(eps, pad_id=0)
    rows, counts = identical_rows(batch, torch.arange(len(eps)))
    assert rows.tolist() == [0, 1, 3, 4, 7]
    assert counts.tolist() == [3, 2, 1, 1, 1]
    # A subset (a rank's rows): indices into the batch, in the subset's order.
    rows, counts = identical_rows(batch, torch.tensor([5, 6, 1, 2]))
    assert (rows.tolist(), counts.tolist()) == ([5, 6], [2, 2])
    # Reference log-probs are compared too.
    ref = torch.zeros(len(eps), 3)
    ref[2, 0] = -1.0
    rows, counts = identical_rows(pack(eps, 0, ref), torch.arange(len(eps)))
    assert (rows.tolist(), counts.tolist()) == ([0, 1, 2, 3, 4, 7], [2, 2, 1, 1, 1, 1])


def test_the_same_tokens_and_masks_split_at_another_place_are_not_equal() -> None:
    # A multi-turn response ending in environment tokens (mask 0, log-prob 0): the two rows
    # hold the same tokens, masks and log-probs, but train on different tokens.
    a = dataclasses.replace(
        episode([2, 3], [4, 5]),
        loss_mask=torch.tensor([True, False]),
        behavior_logprobs=torch.tensor([-0.5, 0.0]),
    )
    b = dataclasses.replace(
        episode([2], [3, 4, 5]),
        loss_mask=torch.tensor([True, False, False]),
        behavior_logprobs=torch.tensor([-0.5, 0.0, 0.0]),
    )
    batch = pack([a, b], pad_id=0)
    assert torch.equal(batch.input_ids[0], batch.input_ids[1])
    assert torch.equal(batch.response_mask[0], batch.response_mask[1])
    assert torch.equal(batch.behavior_logprobs[0], batch.behavior_logprobs[1])
    rows, counts = identical_rows(batch, torch.arange(2))
    assert (rows.tolist(), counts.tolist()) == ([0, 1], [1, 1])


def test_the_distinct_sequences_of_a_batch_ignore_what_no_forward_pass_reads() -> None:
    eps = [
        episode([2, 3], [4, 5]),  # 0
        episode([2, 3], [4, 5], lp=-0.25, advantage=-1.0),  # 1: 0's tokens: the same pass
        episode([2, 3], [4]),  # 2: a prefix of 0's response
        episode([2], [3, 4, 5]),  # 3: 0's tokens end to end, another prompt
        episode([2, 3], [4]),  # 4 = 2
    ]
    first, of_row = distinct_sequences(pack(eps, pad_id=0))
    assert sorted(first.tolist()) == [0, 2, 3]
    assert first[of_row].tolist() == [0, 0, 2, 3, 2]  # each row's kind is its first


class TokenCounting(torch.nn.Module):
    """A model that counts the token positions its forward passes are given."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.tokens = model, 0

    def forward(self, *args: object, **kwargs: torch.Tensor) -> object:
        self.tokens += kwargs["input_ids"].numel()
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("budget", [0, 20])
def test_the_reference_pass_runs_each_distinct_episode_once(
    tiny_checkpoint: Path, budget: int
) -> None:
    tok = load_tokenizer(str(tiny_checkpoint))
    one, two = tok.encode("count to 2:"), tok.encode("count to 3:")
    right, wrong = tok.encode(" 1 2"), tok.encode(" 1 2 3")
    kinds = [episode(one, right), episode(one, wrong), episode(two, right)]
    eps = [kinds[0]] * 5 + [kinds[1], kinds[2]] * 2
    model = load_policy(str(tiny_checkpoint))
    pad = int(tok.pad_token_id or 0)

    def reference(episodes: list[Episode]) -> tuple[torch.Tensor, int]:
        counting = TokenCounting(model)
        lp = sequence_logprobs_in_passes(
            counting,  # type: ignore[arg-type]
            pack(episodes, pad),
            1.0,
            1.0,
            len(tok),
            token_budget=budget,
        )
        return lp, counting.tokens

    got, tokens = reference(eps)
    assert tokens == reference(kinds)[1]  # the nine episodes cost what the three do
    with torch.no_grad():
        each = sequence_logprobs(model, pack(eps, pad), 1.0, 1.0, len(tok))  # a row each
    assert got.shape == each.shape
    torch.testing.assert_close(got, each, rtol=0, atol=1e-6)
    assert (got[:5] == got[0]).all()


def test_a_row_weighted_n_is_n_rows_in_the_loss() -> None:
    lp = torch.tensor([[-0.4, -0.9], [-1.2, 0.0]])
    behavior = torch.tensor([[-0.5, -1.0], [-1.0, 0.0]])
    adv = torch.tensor([1.0, -0.5])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    cfg = LossConfig(clip_eps=0.2)
    three = (torch.tensor([0, 0, 0, 1]),)  # row 0 three times, row 1 once
    want, want_stats = grpo_loss(lp[three], behavior[three], adv[three], mask[three], cfg)
    weighted = mask * torch.tensor([[3.0], [1.0]])
    got, stats = grpo_loss(lp, behavior, adv, weighted, cfg, token_count=7)
    assert got.item() == pytest.approx(want.item())
    assert dataclasses.asdict(stats) == pytest.approx(dataclasses.asdict(want_stats))
    assert stats.tokens == 7


def test_a_step_over_merged_rows_is_the_step_over_every_episode(tiny_checkpoint: Path) -> None:
    tok = load_tokenizer(str(tiny_checkpoint))
    loss = LossConfig(kl_coef=0.1, entropy_coef=0.05)
    merged, plain = (
        TrainerCore(
            load_policy(str(tiny_checkpoint)),
            TrainerConfig(lr=1e-2, loss=loss, merge_identical=merge, micro_batch_tokens=40),
            SamplingConfig(group_size=4, max_new_tokens=6),
            vocab_size=len(tok),
            pad_id=int(tok.pad_token_id),
            total_steps=10,
        )
        for merge in (True, False)
    )
    # Two groups of 4: the first repeats one answer three times, the second holds a pair.
    a, b = tok("count to 3:").input_ids, tok("count to 2:").input_ids
    eps = [
        episode(a, [7, 8, 9], 0.5),
        episode(a, [7, 8, 9], 0.5),
        episode(a, [7, 8], -1.5),
        episode(a, [7, 8, 9], 0.5),
        episode(b, [5], 1.0, group=1),
        episode(b, [5, 6, 6, 6], -1.0, group=1),
        episode(b, [5], 1.0, group=1),
        episode(b, [6, 6], -1.0, group=1),
    ]
    ref = torch.full((len(eps), 4), -0.7)
    rows: list[int] = []
    merged.model.register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(len(kw["input_ids"])), with_kwargs=True
    )
    got, want = merged.step(eps, ref), plain.step(eps, ref)
    # Two prompts, then the 5 distinct responses (12 tokens) packed
    # into 3 rows of 4 places, in one micro-batch; a row per episode takes more.
    assert rows == [2, 3]
    assert (got.rows, want.rows) == (5, 8)  # the rows the step reports (its trace span's)
    assert got.loss.tokens == want.loss.tokens == 19
    for field in ("loss", "policy_loss", "kl", "ratio_mean", "clip_frac", "entropy"):
        assert getattr(got.loss, field) == pytest.approx(
            getattr(want.loss, field), rel=1e-5, abs=1e-7
        ), field
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
    grads = dict(plain.model.named_parameters())
    for name, p in merged.model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-7, msg=name)
