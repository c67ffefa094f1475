"""An episode as one token sequence with a loss mask, for an LLM trainer.

The package knows no tokenizer: the app passes `encode` (environment text -> token ids) and
two accessors that read its own policy payload (token ids and their behaviour log-probs).
The policy's tokens are taken from its payload, never re-tokenized from its text, so the
trainer sees exactly the tokens that were sampled. Build the policy's generation context
with `context_ids` and the training sequence with `tokenize_episode`: both join the
segments the same way, so what was generated and what is trained agree token for token.

`encode` is applied to each environment segment alone; it should add no special tokens.
Wrap it to add separators (for example `lambda text: tok.encode("\\n" + text + "\\n")`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rl_envs.episode import EpisodeRecord, Segment

P = TypeVar("P")


@dataclass(frozen=True)
class TokenizedEpisode:
    """One episode for the trainer (lists: they cross process boundaries cheaply).

    Attributes:
        prompt_ids: the environment's first observation, encoded, shape [P]; context only.
        response_ids: everything after it, in order, shape [R]: each policy turn's sampled
            tokens and the environment's answers between turns. An environment answer after
            the last policy turn is left out (nothing follows it to train).
        policy_mask: [R] booleans: True for a token the policy sampled (trained on, has a
            behaviour log-prob), False for an environment token (context only).
        behavior_logprobs: [R] natural-log probabilities of the policy tokens under the
            policy that sampled them; 0.0 at environment tokens (never read there).
        reward: the episode's return (`EpisodeRecord.reward`).
        turns: [R] the policy turn (0-based, the index into `EpisodeRecord.rewards`) each
            token belongs to; -1 at environment tokens. It spreads per-turn credit over
            the turn's tokens.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    policy_mask: list[bool]
    behavior_logprobs: list[float]
    reward: float
    turns: list[int]


def context_ids(
    segments: Sequence[Segment[P]],
    *,
    encode: Callable[[str], Sequence[int]],
    token_ids: Callable[[P], Sequence[int]],
) -> list[int]:
    """The token ids of a conversation so far: environment segments encoded, policy
    segments as the policy sampled them. A policy calls this to build its prompt."""
    ids: list[int] = []
    for segment in segments:
        ids.extend(_segment_ids(segment, encode, token_ids))
    return ids


def tokenize_episode(
    record: EpisodeRecord[P],
    *,
    encode: Callable[[str], Sequence[int]],
    token_ids: Callable[[P], Sequence[int]],
    logprobs: Callable[[P], Sequence[float]],
) -> TokenizedEpisode:
    """The training view of a completed episode (see `TokenizedEpisode`). A failed episode
    (`ValueError`: drop it), a policy turn whose log-probs do not match its tokens one to
    one, or one with no tokens at all are errors naming the turn."""
    if not record.ok:
        raise ValueError(f"a failed episode ({record.error}) has no tokens: drop it")
    segments = list(record.segments)
    while segments and segments[-1].source == "environment":
        segments.pop()
    if not segments:
        raise ValueError("the episode has no policy turn to train on")
    prompt = context_ids(segments[:1], encode=encode, token_ids=token_ids)
    response: list[int] = []
    mask: list[bool] = []
    behavior: list[float] = []
    turns: list[int] = []
    turn = 0
    for segment in segments[1:]:
        ids = _segment_ids(segment, encode, token_ids)
        if segment.source == "policy":
            turn += 1
            assert segment.payload is not None
            lps = [float(x) for x in logprobs(segment.payload)]
            if len(lps) != len(ids) or not ids:
                raise ValueError(
                    f"policy turn {turn}: {len(ids)} token ids but {len(lps)} log-probs "
                    "(need one per token, at least one token)"
                )
            if not all(math.isfinite(x) and x <= 0.0 for x in lps):
                raise ValueError(f"policy turn {turn}: log-probs must be finite and <= 0")
            behavior.extend(lps)
            mask.extend([True] * len(ids))
            turns.extend([turn - 1] * len(ids))
        else:
            behavior.extend([0.0] * len(ids))
            mask.extend([False] * len(ids))
            turns.extend([-1] * len(ids))
        response.extend(ids)
    return TokenizedEpisode(prompt, response, mask, behavior, record.reward, turns)


def _segment_ids(
    segment: Segment[P],
    encode: Callable[[str], Sequence[int]],
    token_ids: Callable[[P], Sequence[int]],
) -> list[int]:
    if segment.source == "policy":
        if segment.payload is None:
            raise ValueError("a policy segment without a payload has no token ids")
        return [int(t) for t in token_ids(segment.payload)]
    return [int(t) for t in encode(segment.text)]
