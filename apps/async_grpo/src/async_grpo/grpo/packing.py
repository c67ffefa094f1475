"""A batch's responses packed end to end into rows, for the pass that follows the shared
prompt pass (`batching.response_logits`): each response reads its own prompt's keys and
values and its own earlier tokens, at its own positions, and no place is spent on padding
but the ends of the rows.

On the tiny preset's batches (CPU, one thread) this made the train step 1.19x-1.28x faster
than one or two length-sorted passes padded to their longest response (measured in
apps/async_grpo/README.md, "Async vs sync").
"""

from __future__ import annotations

import bisect
import dataclasses

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class PackedResponses:
    """A batch's responses packed end to end into R rows of W tokens, for one pass after
    the shared prompt pass: `input_ids` [R, W] (padding past the last response of a row),
    `positions` [R, W] each token's position in its own episode, `prompts` [R, Q] the
    distinct prompts (indices into the prompt pass) whose keys and values each row's cache
    holds, side by side (a row with fewer repeats one it never attends to), `attention`
    [R, 1, W, Q * prompt length + W] True where a token may attend: its own prompt's real
    tokens and its own response up to itself (a padding token: itself alone);
    `row` / `offset` [B] where each episode's response starts."""

    input_ids: Tensor
    positions: Tensor
    prompts: Tensor
    attention: Tensor
    row: Tensor
    offset: Tensor


def pack_rows(
    lengths: list[int], prompts: list[int], width: int, max_prompts: int
) -> tuple[list[int], list[int], list[list[int]]]:
    """Places runs of `lengths` tokens (a run of 0 takes one place), run i reading prompt
    `prompts[i]`, end to end in rows of `width` (>= the longest) holding runs of at most
    `max_prompts` distinct prompts: best fit, longest first. Returns each run's row and
    offset within it, and each row's distinct prompts in order of arrival."""
    if len(prompts) != len(lengths):
        raise ValueError(f"pack_rows: {len(lengths)} runs but {len(prompts)} prompts")
    if max_prompts < 1 or width < max((max(n, 1) for n in lengths), default=1):
        raise ValueError(
            f"pack_rows: width {width} must hold the longest run "
            f"({max(lengths, default=0)} tokens) and max_prompts ({max_prompts}) be >= 1"
        )
    rows, offsets = [0] * len(lengths), [0] * len(lengths)
    used: list[int] = []
    held: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free places, row), ascending
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], prompts[i])):
        need, prompt = max(lengths[i], 1), prompts[i]
        k = bisect.bisect_left(room, (need, -1))
        while (
            k < len(room)
            and prompt not in held[room[k][1]]
            and len(held[room[k][1]]) >= max_prompts
        ):
            k += 1
        if k == len(room):
            r = len(used)
            used.append(0)
            held.append([])
        else:
            r = room.pop(k)[1]
        rows[i], offsets[i] = r, used[r]
        used[r] += need
        if prompt not in held[r]:
            held[r].append(prompt)
        if used[r] < width:
            bisect.insort(room, (width - used[r], r))
    return rows, offsets, held


def pack_responses(
    tokens: Tensor, at: Tensor, lengths: Tensor, of_row: Tensor, prompt_mask: Tensor
) -> PackedResponses:
    """The responses of a batch packed for the pass after the shared prompt pass: `tokens`
    and `at` [B, T] each response token and its position, `lengths` [B] response tokens,
    `of_row` [B] each row's prompt, `prompt_mask` [P, prompt length] (`_shared_prompts`)."""
    device = tokens.device
    width = max(1, int(lengths.max()))
    # A row's prompt keys stay within its own width plus one prompt, so that a row of many
    # short responses to different prompts does not attend to a long run of prompts.
    longest_prompt = prompt_mask.shape[1]
    row_list, offset_list, in_row = pack_rows(
        lengths.tolist(), of_row.tolist(), width, max(1, (width + longest_prompt) // longest_prompt)
    )
    n_rows = len(in_row)
    slot_list = [in_row[r].index(p) for r, p in zip(row_list, of_row.tolist(), strict=True)]
    q = max(len(ps) for ps in in_row)
    prompts = torch.tensor([ps + ps[:1] * (q - len(ps)) for ps in in_row], device=device)
    row, offset = torch.tensor(row_list, device=device), torch.tensor(offset_list, device=device)
    slot = torch.tensor(slot_list, device=device)
    # Each place's owner, the row of the batch whose response it holds (-1: padding).
    span = lengths.clamp(min=1)
    e_rows, e_cols = run_positions(span.cpu())
    e_rows, e_cols = e_rows.to(device), e_cols.to(device)
    owner = torch.full((n_rows, width), -1, device=device)
    owner[row[e_rows], offset[e_rows] + e_cols] = e_rows
    input_ids = torch.zeros((n_rows, width), dtype=tokens.dtype, device=device)
    positions = torch.zeros((n_rows, width), dtype=at.dtype, device=device)
    # A response of no tokens takes one place, holding the padding that follows its prompt.
    input_ids[row[e_rows], offset[e_rows] + e_cols] = tokens[e_rows, e_cols]
    positions[row[e_rows], offset[e_rows] + e_cols] = at[e_rows, e_cols]
    places = torch.arange(width, device=device)
    causal = places.unsqueeze(1) >= places.unsqueeze(0)
    same = (owner.unsqueeze(2) == owner.unsqueeze(1)) & causal
    padding = owner < 0
    own = same & ~padding.unsqueeze(2) | torch.eye(
        width, dtype=torch.bool, device=device
    ) & padding.unsqueeze(2)
    # A token's prompt keys: the slot of its own prompt, that prompt's real tokens.
    slots = torch.arange(q, device=device)
    of_slot = (slot[owner.clamp(min=0)].unsqueeze(2) == slots) & ~padding.unsqueeze(2)  # [R, W, Q]
    prompt_keys = of_slot.unsqueeze(3) & prompt_mask[prompts].bool().unsqueeze(1)  # [R, W, Q, Lp]
    attention = torch.cat([prompt_keys.flatten(2, 3), own], 2).unsqueeze(1)
    return PackedResponses(input_ids, positions, prompts, attention, row, offset)


def run_positions(lengths: Tensor) -> tuple[Tensor, Tensor]:
    """For rows of `lengths` [B] tokens laid end to end: each token's row and its index
    within its row, both [sum(lengths)]."""
    rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    return rows, torch.arange(len(rows)) - starts[rows]
