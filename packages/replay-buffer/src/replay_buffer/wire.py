"""How many episodes cross a process boundary at once: as one columnar message.

An RL step sends batches of episodes between processes (generator to buffer, buffer to
trainer), every one a pickle. Pickled one by one, each episode costs three tensor copies in
and three out, plus its own checks. `EpisodeBatch` pickles its episodes as one record per
field instead: every tensor field of every episode concatenated into one buffer, the scalars
in lists. Unpickled, each episode's tensors are views into those buffers (one copy per
field for the whole batch).

Unpickling does not check the episodes again: each was checked where it was built, and
pickle is for trusted data only (it runs code). A batch holding a tensor that is not a plain
CPU tensor (on a GPU, a subclass) is pickled episode by episode instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import torch

from replay_buffer.episode import FIELDS, Episode, cpu_bytes, trusted_episode

_COLUMNS: tuple[tuple[str, torch.dtype], ...] = (
    ("prompt_ids", torch.long),
    ("response_ids", torch.long),
    ("behavior_logprobs", torch.float32),
)
_OPTIONAL: tuple[tuple[str, torch.dtype], ...] = (
    ("loss_mask", torch.bool),
    ("token_advantages", torch.float32),
)


class EpisodeBatch(Sequence[Episode]):
    """An immutable sequence of episodes that pickles as one columnar record (see the
    module docstring). Use it wherever a list of episodes is sent to another process; it is
    read like a tuple (`len`, indexing, slicing, iteration)."""

    __slots__ = ("_episodes",)

    def __init__(self, episodes: Iterable[Episode] = ()) -> None:
        self._episodes = tuple(episodes)
        for i, e in enumerate(self._episodes):
            if not isinstance(e, Episode):
                raise TypeError(f"EpisodeBatch[{i}] must be an Episode, got {type(e).__name__}")

    @overload
    def __getitem__(self, index: int) -> Episode: ...
    @overload
    def __getitem__(self, index: slice) -> EpisodeBatch: ...
    def __getitem__(self, index: int | slice) -> Episode | EpisodeBatch:
        if isinstance(index, slice):
            return EpisodeBatch(self._episodes[index])
        return self._episodes[index]

    def __len__(self) -> int:
        return len(self._episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self._episodes)

    def __repr__(self) -> str:
        return f"EpisodeBatch({len(self._episodes)} episodes)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpack_batch, (pack(self._episodes),))


def pack(episodes: Sequence[Episode]) -> tuple[Any, ...]:
    """`episodes` as plain picklable values: one byte string per tensor field (every
    episode's tensor concatenated), lengths and scalars in lists. `unpack` reverses it."""
    if not all(_plain(e) for e in episodes):
        return ("episodes", tuple(episodes))
    response_lens = [len(e.response_ids) for e in episodes]
    columns = {
        name: cpu_bytes(_cat([getattr(e, name) for e in episodes], dtype))
        for name, dtype in _COLUMNS
    }
    optional = {}
    for name, dtype in _OPTIONAL:
        present = [getattr(e, name) for e in episodes if getattr(e, name) is not None]
        if present:
            optional[name] = (
                [getattr(e, name) is not None for e in episodes],
                cpu_bytes(_cat(present, dtype)),
            )
    scalars = {
        "reward": [e.reward for e in episodes],
        "advantage": [e.advantage for e in episodes],
        "policy_version": [e.policy_version for e in episodes],
        "group_id": [e.group_id for e in episodes],
        "metadata": [e.metadata for e in episodes],
    }
    prompt_lens = [len(e.prompt_ids) for e in episodes]
    return ("columns", prompt_lens, response_lens, columns, optional, scalars)


def unpack(packed: tuple[Any, ...]) -> tuple[Episode, ...]:
    """The episodes `pack` made `packed` from, their tensors views into one buffer per
    field."""
    if packed[0] == "episodes":
        return tuple(packed[1])
    _, prompt_lens, response_lens, columns, optional, scalars = packed
    lens = {"prompt_ids": prompt_lens, "response_ids": response_lens}
    fields: dict[str, Sequence[Any]] = {
        name: _split(columns[name], dtype, lens.get(name, response_lens))
        for name, dtype in _COLUMNS
    }
    for name, dtype in _OPTIONAL:
        if name not in optional:
            fields[name] = [None] * len(response_lens)
            continue
        has, data = optional[name]
        parts = iter(_split(data, dtype, [n for n, h in zip(response_lens, has, strict=True) if h]))
        fields[name] = [next(parts) if h else None for h in has]
    fields.update(scalars)
    columns_in_order = [fields[name] for name in FIELDS]
    # Checked where they were built (module docstring).
    return tuple(trusted_episode(values) for values in zip(*columns_in_order, strict=True))


def _unpack_batch(packed: tuple[Any, ...]) -> EpisodeBatch:
    batch = EpisodeBatch.__new__(EpisodeBatch)
    batch._episodes = unpack(packed)
    return batch


def _plain(e: Episode) -> bool:
    tensors = (e.prompt_ids, e.response_ids, e.behavior_logprobs, e.loss_mask, e.token_advantages)
    return all(t is None or (type(t) is torch.Tensor and t.device.type == "cpu") for t in tensors)


def _cat(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(tensors) if tensors else torch.empty(0, dtype=dtype)


def _split(data: bytes, dtype: torch.dtype, lens: list[int]) -> Sequence[torch.Tensor]:
    if not data:
        return [torch.empty(0, dtype=dtype) for _ in lens]
    parts: tuple[torch.Tensor, ...] = torch.split(
        torch.frombuffer(bytearray(data), dtype=dtype), lens
    )
    return parts
