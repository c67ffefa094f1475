"""Turning episodes into padded tensors, cutting them into micro-batches, and recomputing
their log-probs with a model.

The trainer and the reference model both call `sequence_logprobs`; it goes through
`logprobs.token_logprobs_and_entropy`, the same distribution the generator sampled from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from replay_buffer import Episode, columns_of
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from async_grpo.grpo.logprobs import token_logprobs_and_entropy
from async_grpo.grpo.packing import pack_responses, run_positions


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """B episodes as right-padded tensors.

    `input_ids` [B, L] prompt then response then padding (L = longest prompt+response);
    `attention_mask` [B, L] 1 on real tokens; `response_start` [B] index of each row's first
    response token; `response_mask` [B, T] (T = longest response) 1.0 on the response
    tokens the policy produced (`Episode.loss_mask`; all real response tokens without one),
    0.0 on environment tokens and padding; `behavior_logprobs` [B, T] the generator's
    log-probs of those tokens (0 on padding); `ref_logprobs` [B, T] the reference model's,
    or None when KL is off; `advantages` [B] one per episode, or [B, T] one per response token
    when an episode of the batch carries `token_advantages` (the others' broadcast);
    `count` [B] how many of the step's episodes each row stands for (`identical_rows`: a row
    whose duplicates were set aside counts for them too, a set-aside duplicate 0), or None:
    one each.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_start: Tensor
    response_mask: Tensor
    behavior_logprobs: Tensor
    ref_logprobs: Tensor | None
    advantages: Tensor
    count: Tensor | None = None

    def to(self, device: torch.device) -> TrainBatch:
        """The same batch on `device` (a no-op where it already is)."""
        ref = self.ref_logprobs.to(device) if self.ref_logprobs is not None else None
        count = self.count.to(device) if self.count is not None else None
        return TrainBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_start=self.response_start.to(device),
            response_mask=self.response_mask.to(device),
            behavior_logprobs=self.behavior_logprobs.to(device),
            ref_logprobs=ref,
            advantages=self.advantages.to(device),
            count=count,
        )

    @property
    def loss_weight(self) -> Tensor:
        """[B, T] each response token's weight in the loss: `response_mask` times the row's
        `count`."""
        if self.count is None:
            return self.response_mask
        return self.response_mask * self.count.unsqueeze(1).to(self.response_mask.dtype)

    @property
    def seq_lens(self) -> Tensor:
        """[B] each row's real tokens (prompt + response)."""
        return self.attention_mask.sum(1)

    def select(self, rows: Tensor) -> TrainBatch:
        """Rows `rows` [R] (indices) of this batch, in that order, padded only to their own
        longest sequence and response: the batch a pass over just those episodes needs."""
        seq = int(self.seq_lens[rows].max())
        resp = int((self.seq_lens[rows] - self.response_start[rows]).max())
        adv = self.advantages[rows]
        return TrainBatch(
            input_ids=self.input_ids[rows, :seq],
            attention_mask=self.attention_mask[rows, :seq],
            response_start=self.response_start[rows],
            response_mask=self.response_mask[rows, :resp],
            behavior_logprobs=self.behavior_logprobs[rows, :resp],
            ref_logprobs=None if self.ref_logprobs is None else self.ref_logprobs[rows, :resp],
            advantages=adv if adv.dim() == 1 else adv[:, :resp],
            count=None if self.count is None else self.count[rows],
        )


def pack(
    episodes: Sequence[Episode], pad_id: int, ref_logprobs: Tensor | None = None
) -> TrainBatch:
    """Pads `episodes` into a `TrainBatch`; `ref_logprobs` [B, T] (as `sequence_logprobs`
    returns them for the same episodes) is carried along when given."""
    if not episodes:
        raise ValueError("pack: no episodes")
    # A batch that crossed from another process is read as it came (no visit to each
    # episode); anything else is gathered field by field.
    cols = columns_of(episodes)
    prompt_lens, resp_lens = cols.prompt_lens, cols.response_lens
    seq_len = int((prompt_lens + resp_lens).max())
    resp_len = int(resp_lens.max())
    b = len(cols)
    if ref_logprobs is not None and tuple(ref_logprobs.shape) != (b, resp_len):
        raise ValueError(
            f"ref_logprobs must be [{b}, {resp_len}] for these episodes, "
            f"got {list(ref_logprobs.shape)}"
        )
    # One scatter per field instead of a few small copies per episode (128 episodes: several
    # ms of the trainer's step otherwise): each token's row, and its column within the row.
    p_rows, p_cols = run_positions(prompt_lens)
    r_rows, r_cols = run_positions(resp_lens)
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    input_ids[p_rows, p_cols] = cols.prompt_ids
    input_ids[r_rows, r_cols + prompt_lens[r_rows]] = cols.response_ids
    attention = (torch.arange(seq_len) < (prompt_lens + resp_lens).unsqueeze(1)).long()
    # Environment tokens of a multi-turn response are context, not the policy's actions.
    mask = torch.zeros((b, resp_len))
    mask[r_rows, r_cols] = 1.0 if cols.loss_mask is None else cols.loss_mask.float()
    behavior = torch.zeros((b, resp_len))
    behavior[r_rows, r_cols] = cols.behavior_logprobs
    if cols.token_advantages is not None:
        advantages = torch.zeros((b, resp_len))
        advantages[r_rows, r_cols] = cols.token_advantages
    else:
        advantages = cols.advantage.float()
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_start=prompt_lens,
        response_mask=mask,
        behavior_logprobs=behavior,
        ref_logprobs=ref_logprobs,
        advantages=advantages,
    )


def identical_rows(batch: TrainBatch, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Among `rows` [R] (indices) of `batch`, the first of each set of rows equal in every
    field the loss reads (tokens, where the response starts, masks, behaviour and reference
    log-probs, advantages, compared bit for bit): [K] those rows, in the order of `rows`,
    and [K] how many of `rows` each stands for. Equal rows have equal log-probs, entropies
    and loss terms, so a pass over the K rows with each token's loss weighted by its row's
    count is the pass over all R (a group that has learned its answer repeats it: a trained
    tiny run's batches hold a few distinct responses a group)."""
    fields = _pass_inputs(batch)
    fields += [batch.behavior_logprobs, batch.advantages.reshape(len(batch.advantages), -1)]
    if batch.ref_logprobs is not None:
        fields.append(batch.ref_logprobs)
    first, of_row = _distinct_rows(torch.cat([_bits(f[rows]) for f in fields], 1))
    order = torch.argsort(first)
    return rows[first[order]], torch.bincount(of_row, minlength=len(first))[order]


def distinct_sequences(batch: TrainBatch) -> tuple[Tensor, Tensor]:
    """The rows of `batch` that differ in what a forward pass reads (tokens, attention, where
    the response starts and which of its tokens are the policy's): [K] the first row of each
    kind and [B] each row's index into those K. A pass over the K rows, indexed by the
    second, gives every row's log-probs (a group that has learned its answer repeats it)."""
    return _distinct_rows(torch.cat([_bits(f) for f in _pass_inputs(batch)], 1))


def _pass_inputs(batch: TrainBatch) -> list[Tensor]:
    """The fields of `batch` that decide a row's forward pass and which of its tokens count.
    Where the response starts too: with environment tokens (mask 0) at a response's end,
    two rows can hold the same tokens and masks but split them at different places."""
    return [
        batch.input_ids,
        batch.response_start.unsqueeze(1),
        batch.attention_mask,
        batch.response_mask,
    ]


def _distinct_rows(key: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct rows of `key` [R, n]: [K] the first row holding each (in the order of
    `torch.unique`) and [R] each row's index into those K."""
    distinct, of_row = torch.unique(key, dim=0, return_inverse=True)
    n = len(key)
    first = torch.full((len(distinct),), n, device=key.device).scatter_reduce(
        0, of_row, torch.arange(n, device=key.device), "amin"
    )
    return first, of_row


def _bits(t: Tensor) -> Tensor:
    """[R, n] integers holding the elements of `t` [R, ...] bit for bit, whatever its dtype
    (so -0.0 and 0.0 differ, which only keeps two rows apart)."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
    t = t.contiguous()
    if t.dtype != torch.int64:
        t = t.view(ints[t.element_size()])
    return t.reshape(len(t), -1).long()


def micro_batches(seq_lens: Tensor, token_budget: int, at_least: int = 1) -> list[Tensor]:
    """Rows of a batch, as index tensors, cut into micro-batches (one forward and backward
    pass each) by `seq_lens` [B], each row's tokens: the rows sorted by length (stable) and
    cut into the fewest runs of equal size (within one row) whose padded size, rows times
    the run's longest sequence, is at most `token_budget` tokens, and at least `at_least`
    runs (never more than B: a row longer than the budget goes alone). Sorting first keeps
    short rows together, so a pass pads little. `token_budget` 0: every row in one pass, in
    batch order (when `at_least` is 1)."""
    b = len(seq_lens)
    if b == 0:
        raise ValueError("micro_batches: no rows")
    if token_budget < 0 or at_least < 1:
        raise ValueError(
            f"token_budget must be >= 0 and at_least >= 1, got {token_budget}, {at_least}"
        )
    if token_budget == 0 and at_least == 1:
        return [torch.arange(b)]
    order = torch.sort(seq_lens, stable=True).indices
    lens = seq_lens.tolist()
    if token_budget and max(lens) > token_budget:
        return [order[i : i + 1] for i in range(b)]  # that row alone means every row alone
    # No fewer runs than the real tokens need: the search starts there.
    fewest = -(-sum(lens) // token_budget) if token_budget else 1
    for runs in range(min(max(at_least, fewest), b), b + 1):
        cuts = [order[i * b // runs : (i + 1) * b // runs] for i in range(runs)]
        # Sorted: a run's longest row is its last.
        if token_budget == 0 or all(len(c) * lens[int(c[-1])] <= token_budget for c in cuts):
            return cuts
    return cuts


def sequence_logprobs(
    model: PreTrainedModel, batch: TrainBatch, temperature: float, top_p: float, vocab_size: int
) -> Tensor:
    """[B, T] log-probs of each response token under `model`'s sampling distribution
    (0 on padding). Carries gradient when called outside `torch.no_grad`."""
    return sequence_logprobs_and_entropy(model, batch, temperature, top_p, vocab_size)[0]


def sequence_logprobs_in_passes(
    model: PreTrainedModel,
    batch: TrainBatch,
    temperature: float,
    top_p: float,
    vocab_size: int,
    *,
    token_budget: int,
) -> Tensor:
    """`sequence_logprobs` [B, T] without gradient, each distinct row computed once
    (`distinct_sequences`), in micro-batches of at most `token_budget` padded tokens
    (`micro_batches`; 0: one pass)."""
    first, of_row = distinct_sequences(batch)
    kinds = batch.select(first)
    out = torch.zeros((len(first), batch.response_mask.shape[1]), device=first.device)
    with torch.no_grad():
        for rows in micro_batches(kinds.seq_lens.cpu(), token_budget):
            on = rows.to(out.device)
            lp = sequence_logprobs(model, kinds.select(on), temperature, top_p, vocab_size)
            out[on, : lp.shape[1]] = lp.float()
    return out[of_row]


def sequence_logprobs_and_entropy(
    model: PreTrainedModel,
    batch: TrainBatch,
    temperature: float,
    top_p: float,
    vocab_size: int,
    *,
    share_prompts: bool = True,
) -> tuple[Tensor, Tensor]:
    """`sequence_logprobs`, and [B, T] the sampling distribution's entropy at each response
    position (0 on padding); both carry gradient outside `torch.no_grad`. `share_prompts`:
    see `response_logits`."""
    pred, tokens = response_logits(model, batch, share_prompts=share_prompts)
    lp, entropy = token_logprobs_and_entropy(pred, tokens, temperature, top_p, vocab_size)
    return lp * batch.response_mask, entropy * batch.response_mask


def response_logits(
    model: PreTrainedModel, batch: TrainBatch, *, share_prompts: bool = True
) -> tuple[Tensor, Tensor]:
    """[B, T, V] the logits that predict each response token, and [B, T] those tokens
    (padding positions hold some token of the row; the caller masks them).

    A GRPO batch holds each prompt once per group member. With `share_prompts` each distinct
    prompt goes through the model once (`_shared_prompts`), and the responses follow in one
    more call, packed end to end into rows as wide as the longest response
    (`packing.pack_responses`): each response attends to its own prompt's keys and values
    and to its own earlier tokens, at its own positions, so nothing is computed for padding
    but the ends of the packed rows. The gradient reaching a prompt's keys and values is the
    sum over the responses that read them, as when each row runs its prompt itself, so the
    result is the plain pass's up to float rounding. Always two calls of the model, whatever
    the rows: the ranks of a sharded trainer, each with its own rows, make the same calls.
    `share_prompts` False: one plain call, every row running its own prompt."""
    t = batch.response_mask.shape[1]
    # Row i's response token j sits at response_start[i] + j and is predicted one step before.
    at = batch.response_start.unsqueeze(1) + torch.arange(t, device=batch.input_ids.device)
    idx = at.clamp(max=batch.input_ids.shape[1] - 1)
    tokens = batch.input_ids.gather(1, idx)
    if not share_prompts:
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).logits
        return logits.gather(1, (idx - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1])), tokens
    first, of_row, prompt_mask = _shared_prompts(batch)
    prompts = model(
        input_ids=batch.input_ids[first, : prompt_mask.shape[1]],
        attention_mask=prompt_mask,
        use_cache=True,
    )
    # The first response token is predicted by the prompt's last position.
    last = prompts.logits[torch.arange(len(first)), batch.response_start[first] - 1][of_row]
    lengths = batch.seq_lens - batch.response_start
    packed = pack_responses(tokens, at, lengths, of_row, prompt_mask)
    cache = DynamicCache()
    for layer, kv in enumerate(prompts.past_key_values.layers):
        # Each packed row's copies of its prompts' keys and values, side by side: the
        # gradient flowing back through the copies is summed into the one prompt pass.
        keys, values = (
            x[packed.prompts].transpose(1, 2).flatten(2, 3) for x in (kv.keys, kv.values)
        )
        cache.update(keys, values, layer)
    logits = model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention,
        position_ids=packed.positions,
        past_key_values=cache,
    ).logits
    # Token j >= 1 of row b is predicted at its packed place minus one; past a row's end,
    # some place of that row (masked by the caller).
    j = torch.arange(1, t, device=lengths.device)
    src = packed.offset.unsqueeze(1) + torch.minimum(j - 1, (lengths - 1).clamp(min=0).unsqueeze(1))
    pred = torch.cat([last.unsqueeze(1), logits[packed.row.unsqueeze(1), src]], 1)
    return pred, tokens


def _shared_prompts(batch: TrainBatch) -> tuple[Tensor, Tensor, Tensor]:
    """The batch's distinct prompts: [P] the first row holding each, [B] each row's prompt
    (index into the P), and [P, longest prompt] 1 on each prompt's tokens."""
    starts = batch.response_start
    longest = int(starts.max())
    in_prompt = torch.arange(longest, device=starts.device) < starts.unsqueeze(1)
    # A prompt is its length and its tokens (whatever follows it is blanked out).
    key = torch.cat(
        [starts.unsqueeze(1), torch.where(in_prompt, batch.input_ids[:, :longest], -1)], 1
    )
    first, of_row = _distinct_rows(key)
    return first, of_row, in_prompt[first].long()
