"""Sampling: shapes, stopping, and log-probs that the trainer's recomputation reproduces."""

import itertools
import math
from pathlib import Path

import pytest
import torch
from async_grpo.config.schema import SamplingConfig
from async_grpo.generation.decoding import Completion, _split, generate, sample
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import pack, sequence_logprobs
from async_grpo.grpo.logprobs import masked_logits, token_logprobs, token_logprobs_and_entropy
from async_grpo.model.policy import load_policy, load_tokenizer
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def test_masked_logits_top_p_keeps_the_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = masked_logits(logits, 1.0, 0.8, 4).isfinite().tolist()
    assert kept == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    kept = masked_logits(logits, 1.0, 0.81, 4).isfinite().tolist()
    assert kept == [True, True, True, False]
    # A token the trainer must score stays in the support even outside the nucleus.
    keep = torch.tensor(3)
    assert masked_logits(logits, 1.0, 0.8, 4, keep=keep).isfinite().tolist()[3]


def test_token_logprobs_temperature_and_vocab_limit() -> None:
    logits = torch.tensor([1.0, 2.0, 0.0, 50.0])  # the last id is outside the vocabulary
    lp = token_logprobs(logits, torch.tensor(1), temperature=2.0, top_p=1.0, vocab_size=3)
    expected = torch.log_softmax(torch.tensor([0.5, 1.0, 0.0]), -1)[1]
    assert lp.item() == pytest.approx(expected.item())


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_generate_logprobs_match_trainer_recomputation(tiny_checkpoint: Path, top_p: float) -> None:
    torch.manual_seed(0)
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    cfg = SamplingConfig(group_size=3, max_new_tokens=6, temperature=0.7, top_p=top_p)
    prompts = ["count to 1:", "count to 12:", "count to 3: 1 2"]  # different prompt lengths
    groups = generate(model, tok, prompts, cfg, policy_version=7)
    assert [len(g) for g in groups] == [3, 3, 3]
    completions = [c for g in groups for c in g]
    for c in completions:
        assert c.policy_version == 7
        assert 1 <= len(c.response_ids) <= 6
        assert len(c.behavior_logprobs) == len(c.response_ids)
        assert c.finished == (c.response_ids[-1] == tok.eos_token_id)
        assert tok.eos_token_id not in c.response_ids[:-1]
        assert all(lp <= 0 for lp in c.behavior_logprobs)
    assert groups[1][0].prompt_ids == tok("count to 12:", add_special_tokens=False)["input_ids"]
    assert [g[0].prompt for g in groups] == prompts
    assert_trainer_recomputes(model, tok, cfg, groups)


def assert_trainer_recomputes(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    cfg: SamplingConfig,
    groups: list[list[Completion]],
) -> None:
    """The path a sample takes (completions -> the buffer's episodes -> a padded batch), and
    the trainer's log-probs of every response token equal to the generator's."""
    rewards = [float(i % 3) / 2 for i in range(sum(len(g) for g in groups))]
    batch = pack(to_episodes(groups, rewards, itertools.count()), pad_id=tok.pad_token_id)
    with torch.no_grad():
        recomputed = sequence_logprobs(model, batch, cfg.temperature, cfg.top_p, len(tok))
    torch.testing.assert_close(recomputed, batch.behavior_logprobs, atol=1e-4, rtol=0)


def test_generate_is_reproducible_with_a_generator(tiny_checkpoint: Path) -> None:
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    cfg = SamplingConfig(group_size=4, max_new_tokens=5)
    runs = [
        generate(model, tok, ["count to 4:"], cfg, 0, generator=torch.Generator().manual_seed(3))
        for _ in range(2)
    ]
    assert [c.response_ids for c in runs[0][0]] == [c.response_ids for c in runs[1][0]]


def test_text_is_the_decoded_response_without_eos(tiny_checkpoint: Path) -> None:
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    cfg = SamplingConfig(group_size=8, max_new_tokens=4)
    for c in generate(model, tok, ["count to 2:"], cfg, 0)[0]:
        ids = c.response_ids[:-1] if c.finished else c.response_ids
        assert c.text == tok.decode(ids)
        assert len(c.text.split()) == len(ids)  # word-level: one word per token


def test_entropy_of_the_sampling_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    token = torch.tensor([0])
    _, full = token_logprobs_and_entropy(logits, token, 1.0, 1.0, 4)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert full.item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-5)
    # top-p 0.8 keeps {0.5, 0.3}, renormalised: the excluded tokens add nothing (no NaN).
    _, nucleus = token_logprobs_and_entropy(logits, token, 1.0, 0.8, 4)
    q = torch.tensor([0.625, 0.375])
    assert nucleus.item() == pytest.approx(float(-(q * q.log()).sum()), rel=1e-5)
    # Temperature 2 flattens the uniform-by-vocab case not at all: log(3) for 3 equal logits.
    _, flat = token_logprobs_and_entropy(torch.zeros(1, 5), token, 2.0, 1.0, 3)
    assert flat.item() == pytest.approx(math.log(3))


def test_entropy_gradient_is_finite_with_top_p() -> None:
    # Tokens outside the nucleus have log-prob -inf; exp(logp) * logp is masked to 0 in the
    # forward pass, and its backward must be 0 there too, not NaN.
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 0.4, -3.0, -3.0]], requires_grad=True)
    tokens = torch.tensor([0, 1])
    lp, entropy = token_logprobs_and_entropy(logits, tokens, 1.0, 0.7, 4)
    (lp.sum() + entropy.sum()).backward()  # type: ignore[no-untyped-call]
    assert logits.grad is not None
    assert bool(torch.isfinite(logits.grad).all()), logits.grad
    # Out-of-nucleus logits get no gradient at all; kept ones do.
    assert logits.grad[0, 2:].tolist() == [0.0, 0.0]
    assert float(logits.grad[0, :2].abs().sum()) > 0


def test_responses_that_end_leave_the_batch_and_the_rest_stay_exact(tiny_checkpoint: Path) -> None:
    # Seeded so that some responses end (EOS) while others of the same batch go on: the
    # ones going on must keep their own cache rows and positions after the batch shrinks,
    # which the trainer's recomputation of every token's log-prob checks.
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    cfg = SamplingConfig(group_size=8, max_new_tokens=6, temperature=1.5)
    prompts = ["count to 1:", "count to 12:", "count to 3: 1 2"]
    gen = torch.Generator().manual_seed(5)
    groups = generate(model, tok, prompts, cfg, 0, generator=gen)
    lengths = [len(c.response_ids) for g in groups for c in g]
    assert any(c.finished and len(c.response_ids) < 6 for g in groups for c in g), lengths
    assert max(lengths) == 6, lengths  # and at least one ran to the end
    assert_trainer_recomputes(model, tok, cfg, groups)


def test_a_group_prefilled_once_answers_as_repeated_rows_would(tiny_checkpoint: Path) -> None:
    # Greedy decoding is a function of the prompt alone: a prompt prefilled once and its
    # cache copied for its group gives what the same prompt repeated row by row gives.
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    cfg = SamplingConfig(group_size=3, max_new_tokens=5)
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in ["count to 2:", "count to 10:"]]
    shared = sample(model, tok, rows, cfg, 0, greedy=True, repeats=3)
    repeated = sample(model, tok, [r for r in rows for _ in range(3)], cfg, 0, greedy=True)
    assert [c.response_ids for c in shared] == [c.response_ids for c in repeated]
    assert [c.prompt_ids for c in shared] == [c.prompt_ids for c in repeated]
    for a, b in zip(shared, repeated, strict=True):
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        sample(model, tok, rows, cfg, 0, repeats=0)


def test_responses_share_a_forward_row_while_their_prefixes_agree(tiny_checkpoint: Path) -> None:
    # A row's responses share one cache row and one forward pass while they have drawn the
    # same tokens, and split when they differ; each draw is the one a response with its own
    # row would make (the same generator seed gives the same tokens).
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    cfg = SamplingConfig(group_size=8, max_new_tokens=6, temperature=0.5)
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in ["count to 3:", "count to 9:"]]
    widths: list[int] = []  # rows in each forward pass: the prefill, then one per token

    def count(_model: object, _args: object, kwargs: dict[str, torch.Tensor]) -> None:
        widths.append(len(kwargs["input_ids"]))

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    shared = sample(model, tok, rows, cfg, 0, repeats=8, generator=torch.Generator().manual_seed(1))
    shared_widths = widths[:]
    widths.clear()
    apart = sample(
        model,
        tok,
        [r for r in rows for _ in range(8)],
        cfg,
        0,
        generator=torch.Generator().manual_seed(1),
    )
    hook.remove()
    assert [c.response_ids for c in shared] == [c.response_ids for c in apart]
    for a, b in zip(shared, apart, strict=True):
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)
    # The token at index t is fed to the model when its response goes on after it; the
    # responses fed then share one row per distinct (prompt, tokens so far).
    responses = [(i // 8, c.response_ids) for i, c in enumerate(shared)]
    distinct = [
        len({(row, tuple(ids[: t + 1])) for row, ids in responses if len(ids) > t + 1})
        for t in range(cfg.max_new_tokens - 1)
    ]
    going = [sum(len(ids) > t + 1 for _, ids in responses) for t in range(cfg.max_new_tokens - 1)]
    fed = [d for d in distinct if d]
    assert shared_widths == [2, *fed], (shared_widths, distinct)
    assert widths == [16, *[g for g in going if g]]
    assert any(d < g for d, g in zip(distinct, going, strict=True)), "no prefix was shared"
    assert any(d > 2 for d in distinct), "no group split"


def test_split_keeps_one_prefix_per_distinct_token_drawn_from_it() -> None:
    # Prefix 0's three responses drew 5, 5, 7 and prefix 1's two drew 2, 2 (vocab 10):
    # three prefixes now, two extending cache row 0 and one row 1.
    kept, tokens, prefix = _split(
        torch.tensor([0, 0, 0, 1, 1]), torch.tensor([5, 5, 7, 2, 2]), torch.Size([2, 10])
    )
    assert kept is not None
    assert (kept.tolist(), tokens.tolist(), prefix.tolist()) == (
        [0, 0, 1],
        [5, 7, 2],
        [0, 0, 1, 2, 2],
    )
    # Every row extended once, in order: the cache stays as it is.
    kept, tokens, prefix = _split(torch.tensor([0, 1]), torch.tensor([3, 4]), torch.Size([2, 10]))
    assert (kept, tokens.tolist(), prefix.tolist()) == (None, [3, 4], [0, 1])
    # Row 0's responses all ended and row 1's split in two: as many prefixes, other rows.
    kept, tokens, prefix = _split(torch.tensor([1, 1]), torch.tensor([3, 4]), torch.Size([2, 10]))
    assert kept is not None
    assert (kept.tolist(), tokens.tolist(), prefix.tolist()) == ([1, 1], [3, 4], [0, 1])
