"""Where every generated episode went: the run's episode accounting.

Each episode a rollout completes is counted once as generated (`episodes_generated`) and
ends in exactly one of these, so that at every step row

    generated = trained + stale + filtered + dropped + lost + held

- trained: in a batch a train step consumed;
- stale: in the buffer until it was older than `max_policy_age` versions, then evicted
  (with how many versions behind, and how long its responses were);
- filtered: in a group whose rewards were all equal, dropped before the buffer
  (`--trainer.skip_uniform_groups`): such a group teaches nothing;
- dropped: in a multi-turn group with a failed episode (the whole group is dropped);
- lost: to a failure (a buffer that died, the steps rolled back when the trainer was
  restored); their prompts are generated again and counted again;
- held: in the buffer, or taken for the next step, when the row is written.

No episode is evicted for capacity: the buffer's admission limit is its size, so a producer
waits for room instead. Whether what is dropped is biased shows in the mean response length
of stale against trained episodes (peers' staleness rules are known to starve long
rollouts).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Fates:
    """Counters of where generated episodes went (see the module docstring); the token sums
    give mean response lengths."""

    generated: int = 0
    trained: int = 0
    stale: int = 0
    filtered: int = 0
    stale_age_sum: int = 0
    """Versions behind at eviction, summed over stale episodes."""
    trained_tokens: int = 0
    stale_tokens: int = 0

    def record_stale(self, episodes: int, age: int, tokens: int) -> None:
        """`episodes` evicted as too stale, `age` versions behind, `tokens` response tokens."""
        self.stale += episodes
        self.stale_age_sum += age * episodes
        self.stale_tokens += tokens

    @property
    def stale_age_mean(self) -> float:
        return self.stale_age_sum / self.stale if self.stale else 0.0

    @property
    def trained_tokens_mean(self) -> float:
        return self.trained_tokens / self.trained if self.trained else 0.0

    @property
    def stale_tokens_mean(self) -> float:
        return self.stale_tokens / self.stale if self.stale else 0.0
