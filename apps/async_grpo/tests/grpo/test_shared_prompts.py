"""`batching.response_logits`: a prompt that several rows share goes through the model once,
the responses follow packed into rows, and the log-probs, entropies and gradients are those
of every row run on its own."""

from pathlib import Path

import pytest
import torch
from async_grpo.grpo.batching import TrainBatch, pack, sequence_logprobs_and_entropy
from async_grpo.grpo.logprobs import token_logprobs_and_entropy
from async_grpo.model.policy import load_policy
from replay_buffer import Episode
from transformers import PreTrainedModel


def episode(prompt: list[int], response: list[int], group: int) -> Episode:
    return Episode(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(response),
        behavior_logprobs=torch.zeros(len(response)),
        reward=0.0,
        advantage=1.0,
        policy_version=0,
        group_id=group,
    )


def batch_of_groups() -> list[Episode]:
    """Three prompts of different lengths (a group each, one prompt also in another group),
    responses of different lengths, one row whose prompt no other row has."""
    g = torch.Generator().manual_seed(3)

    def words(n: int) -> list[int]:
        return torch.randint(2, 12, (n,), generator=g).tolist()

    prompts = [words(4), words(2), words(6)]
    eps = [
        episode(prompts[p], words(int(torch.randint(1, 7, (1,), generator=g))), p)
        for p in (0, 1, 2)
        for _ in range(4)
    ]
    eps.append(episode(prompts[0], words(3), 3))  # the same prompt in another group
    eps.append(episode(words(5), words(2), 4))  # a prompt of its own
    return eps


def forward_calls(model: PreTrainedModel) -> list[int]:
    """Appends each forward pass's row count to the returned list."""
    seen: list[int] = []
    model.register_forward_hook(
        lambda _m, args, kwargs, _out: seen.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    return seen


def logprobs_entropy_and_grads(
    model: PreTrainedModel, batch: TrainBatch
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    lp, entropy = sequence_logprobs_and_entropy(model, batch, 1.0, 1.0, 12)
    (lp.sum() + 0.3 * entropy.sum()).backward()  # type: ignore[no-untyped-call]
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return lp.detach(), entropy.detach(), grads


def test_shared_prompts_run_once_and_give_each_rows_own_result(tiny_checkpoint: Path) -> None:
    model = load_policy(str(tiny_checkpoint))
    eps = batch_of_groups()
    calls = forward_calls(model)
    lp, entropy, grads = logprobs_entropy_and_grads(model, pack(eps, pad_id=0))
    # One pass over the 4 distinct prompts, then the 14 responses (1 to 6 tokens, 47 in
    # all) packed into 8 rows of 6 places, three of them holding responses to two prompts.
    assert calls == [4, 8]

    calls.clear()
    alone = [logprobs_entropy_and_grads(model, pack([e], pad_id=0)) for e in eps]
    assert calls == [1] * 2 * len(eps)  # a row alone: its prompt, then its response
    for i, (row_lp, row_entropy, _) in enumerate(alone):
        n = len(eps[i].response_ids)
        torch.testing.assert_close(lp[i, :n], row_lp[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[i, :n], row_entropy[0], atol=2e-5, rtol=1e-5)
        assert not lp[i, n:].any()
        assert not entropy[i, n:].any()
    for got, *want in zip(grads, *(g for _, _, g in alone), strict=True):
        torch.testing.assert_close(got, torch.stack(want).sum(0), atol=1e-4, rtol=1e-4)


def test_responses_of_one_length_go_in_one_pass(tiny_checkpoint: Path) -> None:
    model = load_policy(str(tiny_checkpoint))
    eps = [episode([2 + i // 4, 3, 4], [5, 6, 7], i // 4) for i in range(8)]
    calls = forward_calls(model)
    with torch.no_grad():
        sequence_logprobs_and_entropy(model, pack(eps, pad_id=0), 1.0, 1.0, 12)
    assert calls == [2, 8]  # two prompts, then a row of 3 places for each response


def test_distinct_prompts_and_a_row_alone_take_the_same_two_calls(tiny_checkpoint: Path) -> None:
    # The ranks of a sharded trainer must make the same calls whatever their rows share.
    model = load_policy(str(tiny_checkpoint))
    eps = [episode([2 + i, 3], [4, 5, 6][: 1 + i % 3], i) for i in range(5)]
    calls = forward_calls(model)
    with torch.no_grad():
        sequence_logprobs_and_entropy(model, pack(eps, pad_id=0), 1.0, 1.0, 12)
        sequence_logprobs_and_entropy(model, pack(eps[:1], pad_id=0), 1.0, 1.0, 12)
    assert calls == [5, 3, 1, 1]  # responses of 1 to 3 tokens in 3 rows of 3 places


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_shared_pass_matches_the_single_pass_of_the_whole_batch(
    tiny_checkpoint: Path, top_p: float
) -> None:
    model = load_policy(str(tiny_checkpoint))
    batch = pack(batch_of_groups(), pad_id=0)
    # Against one plain pass over the whole padded batch, top-p's nucleus included.
    with torch.no_grad():
        lp, entropy = sequence_logprobs_and_entropy(model, batch, 1.0, top_p, 12)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    t = batch.response_mask.shape[1]
    idx = (batch.response_start.unsqueeze(1) + torch.arange(t)).clamp(max=logits.shape[1] - 1)
    pred = logits.gather(1, (idx - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    want_lp, want_entropy = token_logprobs_and_entropy(
        pred, batch.input_ids.gather(1, idx), 1.0, top_p, 12
    )
    torch.testing.assert_close(lp, want_lp * batch.response_mask, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, want_entropy * batch.response_mask, atol=2e-5, rtol=1e-5)
