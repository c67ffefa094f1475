"""The trainer's core without Monarch: real steps on a tiny model, their guards, and the
path a sample takes from completion to padded batch."""

import itertools
import math
from pathlib import Path

import pytest
import torch
from async_grpo.config.schema import LossConfig, SamplingConfig, TrainerConfig
from async_grpo.generation.decoding import Completion, generate
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import pack
from async_grpo.grpo.step import NonFiniteError, TrainerCore, check_finite
from async_grpo.model.policy import load_policy, load_tokenizer
from replay_buffer import Episode, EpisodeBatch


def core_and_episodes(
    checkpoint: Path, sampling: SamplingConfig, loss: LossConfig
) -> tuple[TrainerCore, EpisodeBatch]:
    torch.manual_seed(0)
    model = load_policy(str(checkpoint))
    model.train(True)
    tok = load_tokenizer(str(checkpoint))
    cfg = TrainerConfig(lr=1e-2, loss=loss)
    core = TrainerCore(
        model, cfg, sampling, vocab_size=len(tok), pad_id=int(tok.pad_token_id), total_steps=10
    )
    prompts = ["count to 3:", "count to 5:"]
    groups = generate(model, tok, prompts, sampling, 0, generator=torch.Generator().manual_seed(1))
    rewards = [float(i % 3) / 2 for i in range(len(prompts) * sampling.group_size)]
    return core, to_episodes(groups, rewards, itertools.count())


def params(core: TrainerCore) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in core.model.named_parameters()}


def test_steps_with_top_p_and_the_entropy_bonus_stay_finite(tiny_checkpoint: Path) -> None:
    # Before the fix, the entropy term's backward was NaN wherever top-p cut a token, and
    # every weight was NaN after one step.
    sampling = SamplingConfig(group_size=4, max_new_tokens=6, top_p=0.9)
    core, episodes = core_and_episodes(tiny_checkpoint, sampling, LossConfig(entropy_coef=0.1))
    before = params(core)
    for step in range(3):
        stats = core.step(episodes, None)
        assert math.isfinite(stats.grad_norm), step
        assert math.isfinite(stats.loss.loss), step
    after = params(core)
    assert core.version == 3
    assert all(bool(t.isfinite().all()) for t in after.values())
    assert any(not torch.equal(before[n], after[n]) for n in after)  # it did train


def test_a_non_finite_loss_is_refused_and_changes_nothing(tiny_checkpoint: Path) -> None:
    sampling = SamplingConfig(group_size=4, max_new_tokens=4)
    core, episodes = core_and_episodes(tiny_checkpoint, sampling, LossConfig(kl_coef=0.1))
    shape = (len(episodes), max(len(e.response_ids) for e in episodes))
    core.step(episodes, torch.full(shape, -1.0))
    before, version = params(core), core.version
    state = {k: v.clone() for k, v in core.optimizer.state_dict()["state"][0].items()}
    ref = torch.full(shape, float("nan"))
    with pytest.raises(
        NonFiniteError, match=r"train step 2: the loss is nan; the step was refused"
    ):
        core.step(episodes, ref)
    assert core.version == version
    assert all(torch.equal(before[n], p) for n, p in params(core).items())
    after_state = core.optimizer.state_dict()["state"][0]
    assert all(torch.equal(state[k], after_state[k]) for k in state)  # Adam's moments too


def test_non_finite_weights_are_named_and_never_published() -> None:
    check_finite({"a": torch.ones(3), "step": torch.tensor(3)}, 4)  # finite: no error
    bad = {"a": torch.ones(3), "b.weight": torch.tensor([1.0, math.inf])}
    with pytest.raises(NonFiniteError, match=r"version 4: weight 'b.weight' is not finite"):
        check_finite(bad, 4)


def test_completions_become_whole_groups_of_episodes() -> None:
    def comp(ids: list[int], version: int) -> Completion:
        return Completion("p", "t", [5, 6], ids, [-0.5] * len(ids), True, version)

    groups = [[comp([1], 3), comp([1, 2], 3)], [comp([4], 2), comp([4], 2)]]
    episodes = to_episodes(groups, [0.0, 1.0, 0.5, 0.5], iter([10, 11]))
    assert [e.group_id for e in episodes] == [10, 10, 11, 11]
    assert [e.advantage for e in episodes] == pytest.approx([-1.0, 1.0, 0.0, 0.0], abs=1e-5)
    assert [e.policy_version for e in episodes] == [3, 3, 2, 2]
    assert episodes[1].response_ids.tolist() == [1, 2]
    with pytest.raises(ValueError, match="4 completions but 3 rewards"):
        to_episodes(groups, [0.0, 1.0, 0.5], itertools.count())
    with pytest.raises(ValueError, match="same number of completions"):
        to_episodes([groups[0], groups[1][:1]], [0.0, 1.0, 0.5], itertools.count())

    batch = pack(episodes, pad_id=0, ref_logprobs=torch.full((4, 2), -1.0))
    assert batch.input_ids.tolist() == [[5, 6, 1, 0], [5, 6, 1, 2], [5, 6, 4, 0], [5, 6, 4, 0]]
    assert batch.response_mask.tolist() == [[1, 0], [1, 1], [1, 0], [1, 0]]
    assert batch.behavior_logprobs.tolist() == [[-0.5, 0], [-0.5, -0.5], [-0.5, 0], [-0.5, 0]]
    assert batch.response_start.tolist() == [2, 2, 2, 2]
    with pytest.raises(ValueError, match=r"ref_logprobs must be \[4, 2\]"):
        pack(episodes, pad_id=0, ref_logprobs=torch.zeros(4, 3))


def test_environment_tokens_of_a_multi_turn_response_are_not_trained() -> None:
    turns = Episode(
        prompt_ids=torch.tensor([5]),
        response_ids=torch.tensor([1, 7, 7, 2]),  # policy, environment x2, policy
        behavior_logprobs=torch.tensor([-0.5, 0.0, 0.0, -0.25]),
        reward=1.0,
        advantage=1.0,
        policy_version=0,
        loss_mask=torch.tensor([True, False, False, True]),
    )
    batch = pack([turns], pad_id=0)
    assert batch.response_mask.tolist() == [[1.0, 0.0, 0.0, 1.0]]
    assert batch.input_ids.tolist() == [[5, 1, 7, 7, 2]]  # still the whole context


def episode(prompt: list[int], response: list[int], **extra: object) -> Episode:
    n = len(response)
    return Episode(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(response),
        behavior_logprobs=-torch.arange(1, n + 1, dtype=torch.float32) / 4,
        reward=0.0,
        advantage=0.5,
        policy_version=0,
        **extra,  # type: ignore[arg-type]
    )


def test_episodes_of_different_lengths_pack_into_their_own_rows() -> None:
    episodes = [
        episode([3, 4, 5], [6]),
        episode([3], [7, 8, 9], loss_mask=torch.tensor([True, False, True])),
        episode([3, 4], [6, 6], token_advantages=torch.tensor([1.0, -2.0])),
    ]
    batch = pack(episodes, pad_id=0)
    assert batch.input_ids.tolist() == [[3, 4, 5, 6], [3, 7, 8, 9], [3, 4, 6, 6]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert batch.response_start.tolist() == [3, 1, 2]
    assert batch.response_mask.tolist() == [[1, 0, 0], [1, 0, 1], [1, 1, 0]]
    assert batch.behavior_logprobs.tolist() == [
        [-0.25, 0, 0],
        [-0.25, -0.5, -0.75],
        [-0.25, -0.5, 0],
    ]
    # One episode with per-token advantages: the others' advantage fills their rows.
    assert batch.advantages.tolist() == [[0.5, 0, 0], [0.5, 0.5, 0.5], [1.0, -2.0, 0]]
    short = pack([episodes[0], episode([3], [6])], pad_id=9)
    assert short.input_ids.tolist() == [[3, 4, 5, 6], [3, 6, 9, 9]]
    assert short.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert short.advantages.tolist() == [0.5, 0.5]


def test_rows_of_a_packed_batch_are_the_batch_packed_from_those_episodes() -> None:
    episodes = [
        episode([3, 4, 5], [6, 6, 6, 6]),
        episode([3], [7, 8, 9], loss_mask=torch.tensor([True, False, True])),
        episode([3, 4], [6], token_advantages=torch.tensor([1.0])),
        episode([3, 4, 5, 5], [6, 7]),
    ]
    ref = -torch.arange(16, dtype=torch.float32).view(4, 4) / 8
    whole = pack(episodes, pad_id=0, ref_logprobs=ref)
    for rows in ([1, 2], [2, 0], [3], [0, 1, 2, 3]):
        part = whole.select(torch.tensor(rows))
        alone = pack([episodes[i] for i in rows], pad_id=0)
        t = alone.response_mask.shape[1]
        for name in ("input_ids", "attention_mask", "response_start", "response_mask"):
            assert torch.equal(getattr(part, name), getattr(alone, name)), (rows, name)
        assert torch.equal(part.behavior_logprobs, alone.behavior_logprobs), rows
        assert part.ref_logprobs is not None
        assert torch.equal(part.ref_logprobs, ref[rows, :t]), rows
        # The whole batch has per-token advantages (episode 2's), so every selection keeps
        # them per token, the others' advantage repeated on their real tokens.
        assert part.advantages.shape == (len(rows), t)
        assert torch.equal(part.advantages * part.response_mask.bool(), alone_advantages(alone))


def alone_advantages(batch: object) -> torch.Tensor:
    adv: torch.Tensor = batch.advantages  # type: ignore[attr-defined]
    mask: torch.Tensor = batch.response_mask  # type: ignore[attr-defined]
    full = adv if adv.dim() == 2 else adv.unsqueeze(1).expand_as(mask)
    return full * mask.bool()


def test_a_checkpoint_with_dropout_trains_on_the_generators_log_probs(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # A checkpoint with attention dropout (real ones ship 0.0 or 0.1): with dropout on in
    # the trainer, its log-probs of the sampled tokens differed from the generator's by
    # ~1.6e-2, so the importance ratio of even a sync step was not 1.
    model = load_policy(str(tiny_checkpoint))
    model.config.attention_dropout = 0.1
    model.save_pretrained(str(tmp_path))
    load_tokenizer(str(tiny_checkpoint)).save_pretrained(str(tmp_path))
    sampling = SamplingConfig(group_size=4, max_new_tokens=6)
    core, episodes = core_and_episodes(tmp_path, sampling, LossConfig())
    assert core.model.config.attention_dropout == 0.1
    stats = core.step(episodes, None)
    assert stats.loss.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.loss.clip_frac == 0.0
