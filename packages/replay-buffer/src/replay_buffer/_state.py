"""The buffer's checkpoint format: plain containers, tensors and numbers only.

Nothing but dicts, lists, tuples, ints, floats, strings, None and tensors (plus whatever
episodes carry in `metadata`), so `torch.save` / `torch.load(weights_only=True)` round-trip
it. Decoding checks everything before the caller changes any state.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from replay_buffer._store import Item
from replay_buffer.config import ReplayBufferConfig
from replay_buffer.episode import Episode, trusted_episode
from replay_buffer.stats import Counters
from replay_buffer.wire import EpisodeBatch

FORMAT_VERSION = 3
# Version 1 had no `loss_mask` per episode, version 2 no `token_advantages`; their episodes
# decode with the default (None).
_READABLE_VERSIONS = (1, 2, 3)
_TOP_LEVEL = {
    "format_version",
    "config",
    "policy_type",
    "policy",
    "rng_state",
    "next_key",
    "last_version",
    "items",
    "counters",
}
# Every field of `Episode`, read from the dataclass: a field added to it later is saved and
# restored without a change here (an older state without it decodes with its default).
_EPISODE_FIELDS = tuple(f.name for f in fields(Episode))


@dataclass(frozen=True)
class Restored:
    """A decoded checkpoint, checked and ready to be swapped in."""

    items: dict[int, Item]
    policy_state: Mapping[str, Any]
    rng: random.Random
    next_key: int
    last_version: int | None
    counters: Counters


def encode(
    *,
    config: ReplayBufferConfig,
    policy_type: str,
    policy_state: dict[str, Any],
    rng: random.Random,
    next_key: int,
    last_version: int | None,
    items: dict[int, Item],
    counters: Counters,
) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "config": asdict(config),
        "policy_type": policy_type,
        "policy": policy_state,
        "rng_state": rng.getstate(),
        "next_key": next_key,
        "last_version": last_version,
        "items": [
            {
                "key": key,
                "times_sampled": item.times_sampled,
                "episodes": [{f: getattr(e, f) for f in _EPISODE_FIELDS} for e in item.episodes],
            }
            for key, item in items.items()
        ],
        "counters": counters.state_dict(),
    }


def episodes_apart(state: Mapping[str, Any]) -> tuple[dict[str, Any], EpisodeBatch]:
    """`state` (as `encode` wrote it) with its episodes taken out, in item order, into one
    `EpisodeBatch`, each item's list replaced by its length; `episodes_back` reverses it.
    How a state crosses a process boundary: one columnar record instead of a few tensors
    per episode (256 episodes: ~3 ms to pickle and unpickle instead of ~90)."""
    items = state["items"]
    episodes = EpisodeBatch(
        trusted_episode([e[name] for name in _EPISODE_FIELDS])
        for item in items
        for e in item["episodes"]
    )
    shell = [{**item, "episodes": len(item["episodes"])} for item in items]
    return {**state, "items": shell}, episodes


def episodes_back(shell: Mapping[str, Any], episodes: EpisodeBatch) -> dict[str, Any]:
    """The state `episodes_apart` took apart."""
    held = iter(episodes)
    items = [
        {
            **item,
            "episodes": [
                {name: getattr(e, name) for name in _EPISODE_FIELDS}
                for e in itertools.islice(held, item["episodes"])
            ],
        }
        for item in shell["items"]
    ]
    return {**shell, "items": items}


def decode(state: object, *, config: ReplayBufferConfig, policy_type: str) -> Restored:
    """Checks `state` against this buffer's config and policy; raises `ValueError` on any
    mismatch or malformed part."""
    if not isinstance(state, Mapping) or set(state) != _TOP_LEVEL:
        got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(
            f"not a replay-buffer state_dict: expected keys {sorted(_TOP_LEVEL)}, got {got}"
        )
    if state["format_version"] not in _READABLE_VERSIONS:
        raise ValueError(
            f"state_dict format_version {state['format_version']!r} is not supported "
            f"(this version reads {', '.join(map(str, _READABLE_VERSIONS))})"
        )
    saved = state["config"]
    if saved != asdict(config):
        here = asdict(config)
        changed = [
            f"{k} (saved {saved.get(k)!r}, here {v!r})"
            for k, v in here.items()
            if not isinstance(saved, Mapping) or saved.get(k) != v
        ]
        raise ValueError(
            "state_dict was saved by a buffer with a different config: " + ", ".join(changed)
        )
    if state["policy_type"] != policy_type:
        raise ValueError(
            f"state_dict was saved with sampling policy {state['policy_type']}, "
            f"this buffer uses {policy_type}"
        )
    rng = random.Random()
    try:
        rng.setstate(_as_tuple(state["rng_state"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"state_dict rng_state is malformed: {e}") from e
    next_key = _int(state["next_key"], "next_key")
    last_version = state["last_version"]
    if last_version is not None:
        last_version = _int(last_version, "last_version")
    try:
        items = _decode_items(state["items"], config, next_key)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"state_dict items are malformed: {e!r}") from e
    return Restored(
        items=items,
        policy_state=state["policy"],
        rng=rng,
        next_key=next_key,
        last_version=last_version,
        counters=Counters.from_state_dict(dict(state["counters"])),
    )


def _decode_items(raw: Any, config: ReplayBufferConfig, next_key: int) -> dict[int, Item]:
    items: dict[int, Item] = {}
    groups: set[object] = set()
    previous = -1
    for index, entry in enumerate(raw):
        where = f"state_dict items[{index}]"
        key = _int(entry["key"], f"{where}.key")
        if not previous < key < next_key:
            raise ValueError(f"{where}.key {key} is out of order or not below next_key")
        previous = key
        times = _int(entry["times_sampled"], f"{where}.times_sampled")
        if times > config.max_resample_count:
            raise ValueError(f"{where}.times_sampled {times} exceeds max_resample_count")
        try:
            episodes = tuple(Episode(**dict(e)) for e in entry["episodes"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where} holds a bad episode: {e}") from e
        if len(episodes) != config.episodes_per_item:
            raise ValueError(
                f"{where} holds {len(episodes)} episodes, expected {config.episodes_per_item}"
            )
        if config.group_size is not None:
            group_id = episodes[0].group_id
            whole = all(e.group_id == group_id for e in episodes)
            if group_id is None or group_id in groups or not whole:
                raise ValueError(f"{where} is not one whole group with a unique group_id")
            groups.add(group_id)
        items[key] = Item.of(episodes, times)
    return items


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _as_tuple(value: Any) -> Any:
    """`random.setstate` wants tuples; a checkpoint format may have turned them into lists."""
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value
