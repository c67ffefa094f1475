"""What a trained batch says about the policy, read field by field: the share of groups
that teach nothing and the mean behaviour log-prob per policy token (two columns of each
step's row, `metrics.StepRow`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from replay_buffer import Episode, columns_of


def batch_diagnostics(episodes: Sequence[Episode], group_size: int) -> tuple[float, float]:
    """(fraction of groups in which every advantage is zero, mean behaviour log-prob per
    policy token) of a trained batch of whole groups, consecutive episodes sharing a group.
    Environment tokens of a multi-turn episode (outside its `loss_mask`) are not counted.
    Read field by field (`columns_of`): a batch that arrived as one record is not unpacked
    into episodes for it."""
    cols = columns_of(episodes)
    if len(cols) == 0:
        return 0.0, 0.0
    if cols.token_advantages is None:
        teaches = cols.advantage != 0
    else:
        # `teaches_nothing`: an episode teaches when any of its token advantages is nonzero.
        owner = cols.token_episodes()
        nonzero = torch.zeros(len(cols)).index_add_(0, owner, (cols.token_advantages != 0).float())
        teaches = nonzero > 0
    uniform = float((~teaches.view(-1, group_size).any(-1)).double().mean())
    logprobs = cols.behavior_logprobs.double()
    if cols.loss_mask is not None:
        logprobs = logprobs[cols.loss_mask]
    return uniform, float(logprobs.sum()) / max(1, cols.policy_tokens)
