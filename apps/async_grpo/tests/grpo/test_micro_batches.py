"""A train step in micro-batches (`trainer.micro_batch_tokens`): how rows are cut, and that
the step and the reference's log-probs are the ones a single pass gives (what one pass over
some rows holds: `test_step.py`)."""

import itertools
from pathlib import Path

import pytest
import torch
from async_grpo.config.schema import LossConfig, SamplingConfig, TrainerConfig
from async_grpo.generation.decoding import generate
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import micro_batches, pack, sequence_logprobs_in_passes
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.policy import load_policy, load_tokenizer


def runs(lens: list[int], budget: int, at_least: int = 1) -> list[list[int]]:
    return [r.tolist() for r in micro_batches(torch.tensor(lens), budget, at_least)]


def test_rows_are_sorted_by_length_and_cut_into_the_fewest_runs_within_the_budget() -> None:
    lens = [5, 3, 9, 3]  # sorted: rows 1, 3 (3 tokens), 0 (5), 2 (9)
    assert runs(lens, 0) == [[0, 1, 2, 3]]  # no budget: one pass, batch order
    assert runs(lens, 36) == [[1, 3, 0, 2]]  # 4 rows x 9 tokens fit exactly
    assert runs(lens, 35) == [[1, 3], [0, 2]]  # 2 x 3 and 2 x 9 tokens
    assert runs(lens, 18) == [[1, 3], [0, 2]]
    # Three runs ([1], [3], [0, 2]) would still pad 2 x 9 = 18: only single rows fit.
    assert runs(lens, 17) == [[1], [3], [0], [2]]
    assert runs(lens, 4) == [[1], [3], [0], [2]]  # rows longer than the budget go alone
    assert runs(lens, 0, at_least=3) == [[1], [3], [0, 2]]
    assert runs(lens, 36, at_least=2) == [[1, 3], [0, 2]]
    assert runs(lens, 36, at_least=9) == [[1], [3], [0], [2]]  # never more runs than rows
    assert runs([4, 4, 4], 8) == [[0], [1, 2]]  # equal lengths keep their order
    with pytest.raises(ValueError, match="no rows"):
        micro_batches(torch.tensor([], dtype=torch.long), 8)
    with pytest.raises(ValueError, match="token_budget must be >= 0"):
        micro_batches(torch.tensor([3]), -1)


def cores(checkpoint: Path, budgets: tuple[int, ...], loss: LossConfig) -> list[TrainerCore]:
    tok = load_tokenizer(str(checkpoint))
    out = []
    for budget in budgets:
        cfg = TrainerConfig(lr=1e-2, loss=loss, micro_batch_tokens=budget)
        out.append(
            TrainerCore(
                load_policy(str(checkpoint)),
                cfg,
                SamplingConfig(group_size=4, max_new_tokens=6),
                vocab_size=len(tok),
                pad_id=int(tok.pad_token_id),
                total_steps=10,
            )
        )
    return out


def test_a_step_in_micro_batches_is_the_step_of_one_pass(tiny_checkpoint: Path) -> None:
    loss = LossConfig(kl_coef=0.1, entropy_coef=0.05)
    # 0: one pass; 30: a few rows a pass; 1: every row alone.
    one, few, single = cores(tiny_checkpoint, (0, 30, 1), loss)
    sampling = one.sampling
    tok = load_tokenizer(str(tiny_checkpoint))
    prompts = ["count to 2:", "count to 5:", "count to 6:"]
    groups = generate(
        one.model, tok, prompts, sampling, 0, generator=torch.Generator().manual_seed(3)
    )
    rewards = [float(i % 3) / 2 for i in range(len(prompts) * sampling.group_size)]
    episodes = to_episodes(groups, rewards, itertools.count())
    lens = [len(e.prompt_ids) + len(e.response_ids) for e in episodes]
    assert len(set(lens)) > 2, lens  # lengths that make the passes differ
    # Budget 30 makes several passes of several rows each; budget 1, a pass a row.
    passes = micro_batches(torch.tensor(lens), 30)
    assert len(passes) > 1, passes
    assert max(len(p) for p in passes) > 1, passes
    whole = pack(episodes, one.pad_id)
    ref = sequence_logprobs_in_passes(
        load_policy(str(tiny_checkpoint)), whole, 1.0, 1.0, one.vocab_size, token_budget=0
    )
    # The reference's passes give the one pass's log-probs, in batch order.
    for budget in (30, 1):
        passed = sequence_logprobs_in_passes(
            load_policy(str(tiny_checkpoint)), whole, 1.0, 1.0, one.vocab_size, token_budget=budget
        )
        torch.testing.assert_close(passed, ref, rtol=0, atol=1e-6)
    results = [core.step(episodes, ref) for core in (one, few, single)]
    base = results[0]
    for got in results[1:]:
        assert got.loss.tokens == base.loss.tokens
        for field in ("loss", "policy_loss", "kl", "ratio_mean", "clip_frac", "entropy"):
            assert getattr(got.loss, field) == pytest.approx(
                getattr(base.loss, field), rel=1e-5, abs=1e-7
            ), field
        assert got.grad_norm == pytest.approx(base.grad_norm, rel=1e-5)
    # The gradients themselves (the step leaves them in place), not the weights: Adam's first
    # step moves every weight by about lr whatever its gradient's size, so rounding in a
    # near-zero gradient would show there as a difference of lr.
    grads = {n: p.grad for n, p in one.model.named_parameters()}
    for core in (few, single):
        for name, p in core.model.named_parameters():
            want = grads[name]
            assert want is not None, name
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-7, msg=name)
    assert one.version == few.version == single.version == 1
