"""The GRPO math against hand-computed values."""

import itertools
import math

import pytest
import torch
from async_grpo.config.schema import AdvantageScale, LossConfig
from async_grpo.grpo.advantages import group_advantages, turn_advantages
from async_grpo.grpo.loss import grpo_loss, k3_kl
from hypothesis import given, settings
from hypothesis import strategies as st


def test_group_advantages_hand_computed() -> None:
    # Group 1: rewards 0, 1 -> mean 0.5, population std 0.5 -> -1, +1.
    # Group 2: rewards 1, 1 -> all equal -> zeros.
    adv = group_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0]), group_size=2, eps=0.0)
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0])


def test_group_advantages_unscaled_is_centred_reward() -> None:
    adv = group_advantages(torch.tensor([1.0, 2.0, 6.0]), group_size=3, scale="none")
    assert adv.tolist() == pytest.approx([-2.0, -1.0, 3.0])


def test_group_advantages_scaled_hand_computed() -> None:
    # mean 3, deviations -2 -1 3, population variance (4+1+9)/3 = 14/3.
    adv = group_advantages(torch.tensor([1.0, 2.0, 6.0]), group_size=3, eps=0.0)
    s = math.sqrt(14 / 3)
    assert adv.tolist() == pytest.approx([-2 / s, -1 / s, 3 / s])


def test_group_advantages_scaled_by_the_mean_hand_computed() -> None:
    # Group 1: mean 3, lowest 1, deviations -2 -1 3, divided by 3 - 1 = 2. Group 2: one
    # success in four, mean 1/4, lowest 0: the success gets (1 - 1/4) / (1/4) = 3, each
    # failure -1.
    adv = group_advantages(
        torch.tensor([1.0, 2.0, 6.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
        group_size=3,
        scale="mean",
        eps=0.0,
    )
    assert adv[:3].tolist() == pytest.approx([-1.0, -0.5, 1.5])
    adv = group_advantages(torch.tensor([0.0, 1.0, 0.0, 0.0]), group_size=4, scale="mean", eps=0.0)
    assert adv.tolist() == pytest.approx([-1.0, 3.0, -1.0, -1.0])


def test_mean_scaling_is_measured_from_the_groups_lowest_reward() -> None:
    # Partial credit of 0.4 under every wrong answer: MaxRL's mean (0.55) would give the
    # right answer (1 - 0.55) / 0.55 = 0.82; measured from the floor (0.55 - 0.4 = 0.15) it
    # gets 3, as it does among zeros.
    floor = group_advantages(torch.tensor([0.4, 1.0, 0.4, 0.4]), 4, scale="mean", eps=0.0)
    assert floor.tolist() == pytest.approx([-1.0, 3.0, -1.0, -1.0])
    # Signed rewards are fine: -1, 1 -> mean 0, lowest -1.
    signed = group_advantages(torch.tensor([-1.0, 1.0]), 2, scale="mean", eps=0.0)
    assert signed.tolist() == pytest.approx([-1.0, 1.0])


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=8, max_size=8),
    shift=st.sampled_from([-3.0, 0.5, 2.0]),
)
def test_mean_scaling_ignores_a_constant_added_to_a_group(
    rewards: list[float], shift: float
) -> None:
    base = group_advantages(torch.tensor(rewards), 8, scale="mean")
    shifted = group_advantages(torch.tensor([r + shift for r in rewards]), 8, scale="mean")
    assert shifted.tolist() == pytest.approx(base.tolist(), abs=1e-4)


@settings(max_examples=200, deadline=None)
@given(rewards=st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=7, max_size=7))
def test_mean_scaling_is_maxrls_mean_where_a_group_has_a_zero(rewards: list[float]) -> None:
    # So runs of 0/1 rewards (the pattern game) train as they did under MaxRL's mean.
    group = torch.tensor([0.0, *rewards])
    expected = (group - group.mean()) / group.mean() if group.any() else torch.zeros(8)
    adv = group_advantages(group, 8, scale="mean", eps=0.0)
    assert adv.tolist() == pytest.approx(expected.tolist())


def test_mean_scaling_pulls_a_rarely_said_right_answer_hardest() -> None:
    """The expected update of the right answer's logit for a policy choosing between a right
    (reward 1) and a wrong answer (0) with probability q and 1 - q, computed exactly over all
    2^8 outcomes of a group of 8. Under "std" and "none" it is the same at q and 1 - q: a
    policy that cannot yet tell two contexts apart is not pulled back towards the middle.
    Under "mean" it is 1 - q (the supervised gradient) less (1 - q)^8, the groups with no
    right answer: a group with k right gives (k right x (8-k)/k x (1-q) + (8-k) wrong x -1 x
    -q) / 8 = 1 - k/8."""

    def expected_update(q: float, scale: AdvantageScale, g: int = 8) -> float:
        total = 0.0
        for outcome in itertools.product([1.0, 0.0], repeat=g):
            right = int(sum(outcome))
            p = q**right * (1 - q) ** (g - right)
            adv = group_advantages(torch.tensor(outcome), group_size=g, scale=scale, eps=0.0)
            # d log pi(answer) / d logit_right: 1 - q for the right answer, -q for the wrong.
            grads = [(1 - q) if x else -q for x in outcome]
            total += p * sum(float(a) * d for a, d in zip(adv, grads, strict=True)) / g
        return total

    for scale in ("std", "none"):
        assert expected_update(0.2, scale) == pytest.approx(expected_update(0.8, scale))
    for q in (0.2, 0.5, 0.8):
        assert expected_update(q, "mean") == pytest.approx((1 - q) - (1 - q) ** 8)
    assert expected_update(0.2, "mean") > 3 * expected_update(0.8, "mean")


def test_unknown_scale_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="scale must be 'std', 'mean' or 'none', got 'max'"):
        group_advantages(torch.tensor([0.0, 1.0]), group_size=2, scale="max")  # type: ignore[arg-type]


def test_group_advantages_rejects_partial_group() -> None:
    with pytest.raises(ValueError, match="group_size=4"):
        group_advantages(torch.zeros(6), group_size=4)


def test_k3_hand_computed() -> None:
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    d = math.log(0.25) - math.log(0.5)
    assert k3_kl(lp, ref).item() == pytest.approx(math.exp(d) - d - 1)
    assert k3_kl(lp, lp).item() == 0.0


def _loss(
    lp: list[list[float]], old: list[list[float]], adv: list[float], cfg: LossConfig
) -> float:
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = grpo_loss(torch.tensor(lp), torch.tensor(old), torch.tensor(adv), mask, cfg)
    return loss.item()


def test_clipped_loss_hand_computed() -> None:
    # Ratios: exp(0.5)=1.6487 (clipped to 1.2 for A=+1), exp(-0.5)=0.6065 (A=+1: unclipped
    # branch is smaller), row 2 token 1: ratio 1, A=-2. Padding token ignored.
    lp = [[0.5, -0.5], [0.0, 9.0]]
    old = [[0.0, 0.0], [0.0, 0.0]]
    expected = -(1.2 * 1 + math.exp(-0.5) * 1 + 1.0 * -2) / 3
    assert _loss(lp, old, [1.0, -2.0], LossConfig(clip_eps=0.2)) == pytest.approx(expected)


def test_clip_for_negative_advantage_keeps_the_pessimistic_branch() -> None:
    # A=-1, ratio 0.5: clip gives 0.8*-1=-0.8 and 0.5*-1=-0.5; min is -0.8 -> loss 0.8.
    lp = torch.tensor([[math.log(0.5)]])
    loss, stats = grpo_loss(
        lp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), LossConfig(clip_eps=0.2)
    )
    assert loss.item() == pytest.approx(0.8)
    assert stats.clip_frac == 1.0


def test_truncated_importance_weight_hand_computed() -> None:
    # ratio e^1=2.718 capped at 2: loss = -2 * A * lp = -2 * 1 * 1 / 1 token.
    lp = torch.tensor([[1.0]], requires_grad=True)
    cfg = LossConfig(importance="truncate", truncate_cap=2.0)
    loss, _ = grpo_loss(lp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()  # type: ignore[no-untyped-call]
    assert lp.grad is not None
    assert lp.grad.item() == pytest.approx(-2.0)  # the weight itself carries no gradient


def test_kl_term_adds_coef_times_mean_k3() -> None:
    lp = torch.tensor([[math.log(0.5), math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    cfg = LossConfig(kl_coef=0.1)
    loss, stats = grpo_loss(lp, lp, torch.tensor([0.0]), torch.ones(1, 2), cfg, ref_logprobs=ref)
    d = math.log(0.5)  # ref - lp on the first token
    k3 = (math.exp(d) - d - 1) / 2
    assert stats.kl == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.1 * k3)


def test_kl_without_reference_is_an_error() -> None:
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1),
                  LossConfig(kl_coef=0.1))  # fmt: skip


@pytest.mark.parametrize("importance", ["clip", "truncate"])
def test_on_policy_gradient_is_reinforce_with_group_baseline(importance: str) -> None:
    """At ratio 1 the GRPO gradient equals REINFORCE with the group-mean baseline."""
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 5, requires_grad=True)  # 4 sequences, 3 tokens, 5 actions
    actions = torch.randint(0, 5, (4, 3))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float)
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0])

    def logprobs() -> torch.Tensor:
        lp = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return lp

    adv = group_advantages(rewards, group_size=2, scale="none")
    cfg = LossConfig(importance=importance)  # type: ignore[arg-type]
    loss, stats = grpo_loss(logprobs(), logprobs().detach(), adv, mask, cfg)
    assert stats.ratio_mean == pytest.approx(1.0)
    (grpo_grad,) = torch.autograd.grad(loss, logits)

    baseline = rewards.view(2, 2).mean(1).repeat_interleave(2)
    reinforce = -((rewards - baseline).unsqueeze(1) * logprobs() * mask).sum() / mask.sum()
    (reinforce_grad,) = torch.autograd.grad(reinforce, logits)
    torch.testing.assert_close(grpo_grad, reinforce_grad)
    assert reinforce_grad.abs().sum() > 0


def test_entropy_bonus_hand_computed() -> None:
    # Two real tokens with entropies 0.5 and 1.5 (the padded one is ignored): mean 1.0.
    entropy = torch.tensor([[0.5, 1.5, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    lp = torch.zeros(1, 3)
    cfg = LossConfig(entropy_coef=0.1)
    loss, stats = grpo_loss(lp, lp, torch.tensor([0.0]), mask, cfg, entropy=entropy)
    assert stats.entropy == pytest.approx(1.0)
    assert loss.item() == pytest.approx(-0.1 * 1.0)
    loss.backward()  # type: ignore[no-untyped-call]
    assert entropy.grad is not None
    assert entropy.grad[0].tolist() == pytest.approx([-0.05, -0.05, 0.0])
    with pytest.raises(ValueError, match="entropy_coef > 0 needs entropy"):
        grpo_loss(lp, lp, torch.tensor([0.0]), mask, cfg)


@settings(max_examples=300, deadline=None)
@given(
    groups=st.integers(1, 6),
    group_size=st.integers(2, 64),
    value=st.floats(-1e6, 1e6, allow_nan=False, width=32),
    scale=st.sampled_from(["std", "mean", "none"]),
)
def test_a_group_of_equal_rewards_gets_exactly_zero_advantages(
    groups: int, group_size: int, value: float, scale: AdvantageScale
) -> None:
    # Found by hand first: all rewards 0.7 in one group of 7 or more gave advantages ~0.06,
    # because the float32 mean rounds one ulp away from 0.7 and the std is ~6e-8, not 0.
    rewards = torch.full((groups * group_size,), value)
    adv = group_advantages(rewards, group_size, scale=scale)
    assert adv.tolist() == [0.0] * (groups * group_size)


def test_equal_group_next_to_an_informative_one() -> None:
    adv = group_advantages(torch.tensor([0.7] * 8 + [0.0] * 7 + [1.0]), group_size=8)
    assert adv[:8].tolist() == [0.0] * 8
    assert adv[8:15].max() < 0 < adv[15]


def test_turn_advantages_with_full_discount_hand_computed() -> None:
    # Three episodes of one task; the third ends after one turn.
    # Returns (discount 1): e0 [0.5+0.5, 0.5] = [1, 0.5]; e1 [0+1, 1] = [1, 1]; e2 [0].
    # Turn 0: returns 1, 1, 0 -> mean 2/3, deviations 1/3 1/3 -2/3, std sqrt(2)/3.
    # Turn 1: returns 0.5, 1 (e2 never got there) -> -1, +1.
    adv = turn_advantages([[0.5, 0.5], [0.0, 1.0], [0.0]], eps=0.0)
    s = math.sqrt(2) / 3
    assert adv[0] == pytest.approx([(1 / 3) / s, -1.0])
    assert adv[1] == pytest.approx([(1 / 3) / s, 1.0])
    assert adv[2] == pytest.approx([(-2 / 3) / s])


def test_turn_advantages_with_no_discount_credit_each_turn_alone() -> None:
    # Discount 0: a turn's return is its own reward. Turn 0: 1, 0 -> +1, -1 (unscaled
    # +0.5, -0.5); turn 1: 0, 1 -> -1, +1; turn 2: 0.25, 0.25 -> equal, zeros.
    adv = turn_advantages([[1.0, 0.0, 0.25], [0.0, 1.0, 0.25]], discount=0.0, eps=0.0)
    assert adv == [pytest.approx([1.0, -1.0, 0.0]), pytest.approx([-1.0, 1.0, 0.0])]
    plain = turn_advantages([[1.0, 0.0, 0.25], [0.0, 1.0, 0.25]], discount=0.0, scale="none")
    assert plain == [pytest.approx([0.5, -0.5, 0.0]), pytest.approx([-0.5, 0.5, 0.0])]


def test_turn_advantages_with_half_discount_hand_computed() -> None:
    # Returns: e0 [1 + 0.5*0, 0] = [1, 0]; e1 [0 + 0.5*1, 1] = [0.5, 1].
    adv = turn_advantages([[1.0, 0.0], [0.0, 1.0]], discount=0.5, scale="none")
    assert adv == [pytest.approx([0.25, -0.5]), pytest.approx([-0.25, 0.5])]


def test_turn_advantages_bad_input() -> None:
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\], got 1.5"):
        turn_advantages([[1.0]], discount=1.5)
    with pytest.raises(ValueError, match="at least one episode"):
        turn_advantages([])
    # One episode alone at every turn: nothing to compare with, zeros.
    assert turn_advantages([[1.0, 0.0]]) == [[0.0, 0.0]]


def test_per_token_advantages_hand_computed() -> None:
    # On-policy (ratio 1): the loss is -mean(A_t) over real tokens; [B, T] advantages are
    # used token by token, [B] ones broadcast, and the two agree when rows are constant.
    lp = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    per_token = torch.tensor([[2.0, -1.0], [0.5, 99.0]])  # the padded 99 is never read
    loss, _ = grpo_loss(lp, lp, per_token, mask, LossConfig())
    assert loss.item() == pytest.approx(-(2.0 - 1.0 + 0.5) / 3)
    rows = torch.tensor([1.0, -2.0])
    a, _ = grpo_loss(lp, lp, rows, mask, LossConfig())
    b, _ = grpo_loss(lp, lp, rows.unsqueeze(1).expand(2, 2), mask, LossConfig())
    assert a.item() == pytest.approx(b.item())
    with pytest.raises(ValueError, match=r"advantages must be \[B\] or \[B, T\]"):
        grpo_loss(lp, lp, torch.zeros(3), mask, LossConfig())
    with pytest.raises(ValueError, match=r"for logprobs \[2, 2\], got \[2, 3\]"):
        grpo_loss(lp, lp, torch.zeros(2, 3), mask, LossConfig())


def test_near_uniform_groups_keep_their_signs() -> None:
    # Rewards a few ulps apart: a float32 mean falls below the group's lowest reward. Values
    # computed in float64 by hand: mean 0.7 + 7.45e-9, population std 1.97e-8 (+ eps 1e-6).
    std = group_advantages(torch.tensor([0.7] * 7 + [0.70000005]), 8, "std")
    assert std[:7].max() < 0 < std[7]
    assert std[7].item() == pytest.approx(0.0511, abs=2e-4)
    assert std.sum().item() == pytest.approx(0.0, abs=1e-6)
    # Magnitude ~70: the float32 `mean - min` turned negative and flipped every sign.
    low, high = 70.42903137207031, 70.42903900146484
    mean = group_advantages(torch.tensor([low] * 5 + [high]), 6, "mean")
    assert mean[5].item() == pytest.approx(2.80, abs=0.01)
    assert mean[:5].max() < 0


@settings(max_examples=500, deadline=None)
@given(
    base=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    ulps=st.lists(st.integers(0, 4), min_size=2, max_size=32),
    scale=st.sampled_from(["std", "mean", "none"]),
)
def test_advantages_of_any_group_sum_to_zero_and_keep_the_rewards_order(
    base: float, ulps: list[int], scale: AdvantageScale
) -> None:
    # Near-uniform groups (continuous rewards, reward models) are where rounding bites.
    rewards = torch.tensor([base] * len(ulps), dtype=torch.float32)
    for _ in range(max(ulps)):
        step = torch.tensor(ulps) > 0
        rewards = torch.where(step, torch.nextafter(rewards, torch.tensor(math.inf)), rewards)
        ulps = [max(0, u - 1) for u in ulps]
    adv = group_advantages(rewards, len(rewards), scale)
    spread = adv.abs().max().item()
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-5 * max(1.0, spread) * len(adv))
    order = torch.argsort(rewards, stable=True)
    assert bool((adv[order].diff() >= 0).all()), (rewards.tolist(), adv.tolist())
    assert adv[torch.argmax(rewards)].item() >= 0.0
