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

from replay_buffer.columns import Columns, check_columns
from replay_buffer.episode import FIELDS, Episode, GroupId, cpu_bytes, trusted_episode

_COLUMNS: tuple[tuple[str, torch.dtype], ...] = (
    ("prompt_ids", torch.long),
    ("response_ids", torch.long),
    ("behavior_logprobs", torch.float32),
)
_OPTIONAL: tuple[tuple[str, torch.dtype], ...] = (
    ("loss_mask", torch.bool),
    ("token_advantages", torch.float32),
)
_SCALARS = ("reward", "advantage", "policy_version", "group_id", "metadata")


class EpisodeBatch(Sequence[Episode]):
    """An immutable sequence of episodes that pickles as one columnar record (see the
    module docstring). Use it wherever a list of episodes is sent to another process; it is
    read like a tuple (`len`, indexing, slicing, iteration), and field by field with
    `columns()`.

    Unpickled, it holds the record's buffers and makes its `Episode` objects only when one
    is first read: a trainer that packs the batch from `columns()` never makes them, and
    sending the batch on pickles the same record again."""

    __slots__ = ("_columns", "_episodes", "_fields", "_packed")

    def __init__(self, episodes: Iterable[Episode] = ()) -> None:
        self._episodes: tuple[Episode, ...] | None = tuple(episodes)
        for i, e in enumerate(self._episodes):
            if not isinstance(e, Episode):
                raise TypeError(f"EpisodeBatch[{i}] must be an Episode, got {type(e).__name__}")
        self._packed: tuple[Any, ...] | None = None
        self._fields: _Fields | None = None
        self._columns: Columns | None = None

    @classmethod
    def from_columns(
        cls, columns: Columns, group_ids: Sequence[GroupId | None] | None = None
    ) -> EpisodeBatch:
        """B episodes given field by field, checked as a whole batch (`check_columns`: a bad
        field raises naming it and the first episode it is wrong in) instead of episode by
        episode. Its `Episode` objects are made only when one is read, and it pickles from
        the columns without making them. `group_ids`: one per episode (None: no groups);
        each episode's `metadata` is empty."""
        check_columns(columns)
        n = len(columns)
        ids = list(group_ids) if group_ids is not None else [None] * n
        if len(ids) != n:
            raise ValueError(f"from_columns: {n} episodes but {len(ids)} group ids")
        for i, g in enumerate(ids):
            if g is not None and (isinstance(g, bool) or not isinstance(g, int | str)):
                raise TypeError(
                    f"episode {i}: Episode.group_id must be an int, a str or None, "
                    f"got {type(g).__name__}"
                )
        tensors = {name: getattr(columns, name) for name, _ in _COLUMNS}
        optional = {
            name: ([True] * n, tensor)
            for name, _ in _OPTIONAL
            if (tensor := getattr(columns, name)) is not None
        }
        scalars: dict[str, list[Any]] = {
            "reward": columns.reward.tolist(),
            "advantage": columns.advantage.tolist(),
            "policy_version": columns.policy_version.tolist(),
            "group_id": ids,
            "metadata": [{} for _ in range(n)],
        }
        lens = (columns.prompt_lens.tolist(), columns.response_lens.tolist())
        batch = cls.__new__(cls)
        batch._episodes, batch._packed, batch._columns = None, None, columns
        batch._fields = _Fields(*lens, tensors, optional, scalars)
        return batch

    @property
    def _items(self) -> tuple[Episode, ...]:
        if self._episodes is None:
            assert self._fields is not None
            self._episodes = self._fields.episodes()
        return self._episodes

    def columns(self) -> Columns:
        """The batch field by field (`Columns`); made once, from the record's buffers when
        the batch was unpickled (no copy), else by concatenating the episodes' fields."""
        if self._columns is None:
            fields = self._fields or _Fields.gather(self._items)
            self._columns = fields.columns()
        return self._columns

    def group_ids(self) -> list[GroupId | None]:
        """Each episode's `group_id`, in order (read from the record when the batch was
        unpickled: no `Episode` is made)."""
        if self._episodes is None:
            assert self._fields is not None
            return list(self._fields.scalars["group_id"])
        return [e.group_id for e in self._episodes]

    @overload
    def __getitem__(self, index: int) -> Episode: ...
    @overload
    def __getitem__(self, index: slice) -> EpisodeBatch: ...
    def __getitem__(self, index: int | slice) -> Episode | EpisodeBatch:
        if isinstance(index, slice):
            if range(len(self))[index] == range(len(self)):
                return self  # immutable: the whole batch is itself
            return EpisodeBatch(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        if self._episodes is None:
            assert self._fields is not None
            return len(self._fields.response_lens)
        return len(self._episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self._items)

    def __repr__(self) -> str:
        return f"EpisodeBatch({len(self)} episodes)"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._packed is None:  # the episodes never change: packed once
            fields = self._fields
            plain = fields is not None and all(_plain_tensor(t) for t in fields.all_tensors())
            self._packed = _pack_fields(fields) if fields and plain else pack(self._items)
        return (_unpack_batch, (self._packed,))


def pack(episodes: Sequence[Episode]) -> tuple[Any, ...]:
    """`episodes` as plain picklable values: one byte string per tensor field (every
    episode's tensor concatenated), lengths and scalars in lists (an unpickled `EpisodeBatch`
    reads its episodes back from it)."""
    if not all(_plain(e) for e in episodes):
        return ("episodes", tuple(episodes))
    return _pack_fields(_Fields.gather(episodes))


def _pack_fields(f: _Fields) -> tuple[Any, ...]:
    columns = {name: cpu_bytes(t) for name, t in f.tensors.items()}
    optional = {name: (has, cpu_bytes(t)) for name, (has, t) in f.optional.items()}
    return ("columns", f.prompt_lens, f.response_lens, columns, optional, f.scalars)


def columns_of(episodes: Sequence[Episode]) -> Columns:
    """`episodes` field by field: an `EpisodeBatch`'s own `columns()` (no copy when it was
    unpickled), else each field of every episode concatenated (one copy per field)."""
    if isinstance(episodes, EpisodeBatch):
        return episodes.columns()
    return _Fields.gather(episodes).columns()


class _Fields:
    """A batch's fields: one tensor per tensor field (every episode's end to end), the
    optional ones with which episodes have them, the lengths and the numbers. Read from a
    packed record (`of`: what an unpickled batch's episodes and its `Columns` are views of)
    or gathered from episodes (`gather`: what `pack` turns into bytes)."""

    def __init__(
        self,
        prompt_lens: list[int],
        response_lens: list[int],
        tensors: dict[str, torch.Tensor],
        optional: dict[str, tuple[list[bool], torch.Tensor]],
        scalars: dict[str, list[Any]],
    ) -> None:
        self.prompt_lens, self.response_lens = prompt_lens, response_lens
        self.tensors, self.optional, self.scalars = tensors, optional, scalars

    @classmethod
    def of(cls, packed: tuple[Any, ...]) -> _Fields:
        _, prompt_lens, response_lens, columns, optional, scalars = packed
        tensors = {name: _tensor(columns[name], dtype) for name, dtype in _COLUMNS}
        present = {
            name: (optional[name][0], _tensor(optional[name][1], dtype))
            for name, dtype in _OPTIONAL
            if name in optional
        }
        return cls(prompt_lens, response_lens, tensors, present, scalars)

    @classmethod
    def gather(cls, episodes: Sequence[Episode]) -> _Fields:
        """The fields of `episodes`, each tensor field concatenated (one copy per field)."""
        tensors = {
            name: _cat([getattr(e, name) for e in episodes], dtype) for name, dtype in _COLUMNS
        }
        present = {}
        for name, dtype in _OPTIONAL:
            has = [getattr(e, name) is not None for e in episodes]
            if any(has):
                kept = [getattr(e, name) for e in episodes if getattr(e, name) is not None]
                present[name] = (has, _cat(kept, dtype))
        scalars = {name: [getattr(e, name) for e in episodes] for name in _SCALARS}
        prompt_lens = [len(e.prompt_ids) for e in episodes]
        return cls(prompt_lens, [len(e.response_ids) for e in episodes], tensors, present, scalars)

    def all_tensors(self) -> list[torch.Tensor]:
        return [*self.tensors.values(), *(t for _, t in self.optional.values())]

    def episodes(self) -> tuple[Episode, ...]:
        lens = {"prompt_ids": self.prompt_lens, "response_ids": self.response_lens}
        fields: dict[str, Sequence[Any]] = {
            name: torch.split(self.tensors[name], lens.get(name, self.response_lens))
            for name, _ in _COLUMNS
        }
        for name, _ in _OPTIONAL:
            if name not in self.optional:
                fields[name] = [None] * len(self.response_lens)
                continue
            has, data = self.optional[name]
            kept = [n for n, h in zip(self.response_lens, has, strict=True) if h]
            parts = iter(torch.split(data, kept))
            fields[name] = [next(parts) if h else None for h in has]
        fields.update(self.scalars)
        columns_in_order = [fields[name] for name in FIELDS]
        # Checked where they were built (module docstring).
        return tuple(trusted_episode(values) for values in zip(*columns_in_order, strict=True))

    def columns(self) -> Columns:
        response_lens = torch.tensor(self.response_lens, dtype=torch.long)
        advantage = torch.tensor(self.scalars["advantage"], dtype=torch.float64)
        filled: dict[str, torch.Tensor | None] = {}
        for name, dtype in _OPTIONAL:
            if name not in self.optional:
                filled[name] = None
                continue
            has, data = self.optional[name]
            if all(has):
                filled[name] = data
                continue
            # An episode without the field gets its meaning spelled out (`Columns`).
            if name == "token_advantages":
                default = torch.repeat_interleave(advantage.to(dtype), response_lens)
            else:
                default = torch.ones(int(response_lens.sum()), dtype=dtype)
            owner = torch.repeat_interleave(torch.tensor(has), response_lens)
            default = default.to(data.device)
            default[owner.to(data.device)] = data
            filled[name] = default
        return Columns(
            prompt_lens=torch.tensor(self.prompt_lens, dtype=torch.long),
            response_lens=response_lens,
            prompt_ids=self.tensors["prompt_ids"],
            response_ids=self.tensors["response_ids"],
            behavior_logprobs=self.tensors["behavior_logprobs"],
            loss_mask=filled["loss_mask"],
            token_advantages=filled["token_advantages"],
            reward=torch.tensor(self.scalars["reward"], dtype=torch.float64),
            advantage=advantage,
            policy_version=torch.tensor(self.scalars["policy_version"], dtype=torch.long),
        )


def _unpack_batch(packed: tuple[Any, ...]) -> EpisodeBatch:
    batch = EpisodeBatch.__new__(EpisodeBatch)
    batch._packed, batch._columns = packed, None
    if packed[0] == "episodes":
        batch._episodes, batch._fields = tuple(packed[1]), None
    else:
        batch._episodes, batch._fields = None, _Fields.of(packed)
    return batch


def _plain(e: Episode) -> bool:
    tensors = (e.prompt_ids, e.response_ids, e.behavior_logprobs, e.loss_mask, e.token_advantages)
    return all(t is None or _plain_tensor(t) for t in tensors)


def _plain_tensor(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor and t.device.type == "cpu"


def _cat(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(tensors) if tensors else torch.empty(0, dtype=dtype)


def _tensor(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype)
