"""Sending a batch of episodes to another process: a plain list against `EpisodeBatch`.

Run from the repository root:

    uv run python packages/replay-buffer/benchmarks/wire.py          # 64, 128, 1024 episodes
    uv run python packages/replay-buffer/benchmarks/wire.py --quick  # 128 only, fewer rounds
    uv run python packages/replay-buffer/benchmarks/wire.py --json rows.json

What it times, in this process: `pickle.dumps` (the sender's cost) and `pickle.loads` (the
receiver's) of the same episodes as a list (each episode pickled on its own) and as one
`EpisodeBatch` (one columnar record), best of 5 rounds of CPU time. A Monarch message
pickles its arguments the same way, so these are the two ends of every `put` and every
batch a trainer receives. An unpickled batch makes its episodes when one is first read, so
the batch is timed twice on the receiving side: loaded and every episode read (what the
buffer pays), and loaded and read field by field with `columns()` (what a trainer that packs
the batch pays). The sender builds a new batch for each send, as a real sender does (a batch
pickled a second time reuses its record). Episodes have a 16-token prompt and 8 to 39
response tokens; a third of them carry a `loss_mask`. The ratios printed are list time /
batch time, all measured in this run.

A sender that builds its batch from plain lists (a controller turning sampled completions
into episodes) is timed both ways, building and pickling together: one checked `Episode` per
row, then an `EpisodeBatch` of them ("built by episode"), against the rows joined field by
field and checked once (`EpisodeBatch.from_columns`, "built by columns").

A checkpoint's cut sends the buffer's whole `state_dict` to the caller: it is timed as the
plain state (a dict of fields per episode, a pickled tensor each) and as the
`BufferSnapshot` the actor answers with (its episodes one columnar record).
"""

from __future__ import annotations

import argparse
import functools
import json
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from replay_buffer import Columns, Episode, EpisodeBatch, ReplayBuffer
from replay_buffer.actor import BufferSnapshot


@dataclass(frozen=True)
class Row:
    episodes: int
    form: str
    dumps_ms: float
    loads_ms: float
    bytes: int


def _episodes(n: int) -> list[Episode]:
    out = []
    for i in range(n):
        r = 8 + i % 32
        out.append(
            Episode(
                prompt_ids=torch.randint(0, 1000, (16,)),
                response_ids=torch.randint(0, 1000, (r,)),
                behavior_logprobs=-torch.rand(r),
                reward=float(i % 2),
                advantage=0.5 - i % 2,
                policy_version=i // 64,
                group_id=i // 16,
                loss_mask=(torch.arange(r) % 4 != 0) if i % 3 == 0 else None,
            )
        )
    return out


def _raw(
    episodes: list[Episode],
) -> list[tuple[list[int], list[int], list[float], float, float, int, int]]:
    """Each episode as the plain lists and numbers a sender starts from (no loss mask)."""
    return [
        (
            e.prompt_ids.tolist(),
            e.response_ids.tolist(),
            e.behavior_logprobs.tolist(),
            e.reward,
            e.advantage,
            e.policy_version,
            int(e.group_id or 0),
        )
        for e in episodes
    ]


def _by_episode(raw: list[Any]) -> EpisodeBatch:
    return EpisodeBatch(
        Episode(
            prompt_ids=torch.tensor(p, dtype=torch.long),
            response_ids=torch.tensor(r, dtype=torch.long),
            behavior_logprobs=torch.tensor(lp, dtype=torch.float32),
            reward=rw,
            advantage=adv,
            policy_version=v,
            group_id=g,
        )
        for p, r, lp, rw, adv, v, g in raw
    )


def _by_columns(raw: list[Any]) -> EpisodeBatch:
    def joined(k: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([x for row in raw for x in row[k]], dtype=dtype)

    columns = Columns(
        prompt_lens=torch.tensor([len(row[0]) for row in raw], dtype=torch.long),
        response_lens=torch.tensor([len(row[1]) for row in raw], dtype=torch.long),
        prompt_ids=joined(0, torch.long),
        response_ids=joined(1, torch.long),
        behavior_logprobs=joined(2, torch.float32),
        loss_mask=None,
        token_advantages=None,
        reward=torch.tensor([row[3] for row in raw], dtype=torch.float64),
        advantage=torch.tensor([row[4] for row in raw], dtype=torch.float64),
        policy_version=torch.tensor([row[5] for row in raw], dtype=torch.long),
    )
    return EpisodeBatch.from_columns(columns, [row[6] for row in raw])


def _cpu_ms(fn: Callable[[], Any], rounds: int, reps: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - start) / reps)
    return best * 1e3


def measure(n: int, rounds: int) -> list[Row]:
    episodes = _episodes(n)
    reps = max(1, 4096 // n)
    rows = []
    data, list_data = pickle.dumps(EpisodeBatch(episodes)), pickle.dumps(episodes)
    forms: tuple[tuple[str, Callable[[], Any], Callable[[], Any]], ...] = (
        (
            "list",
            functools.partial(pickle.dumps, episodes),
            functools.partial(pickle.loads, list_data),
        ),
        ("batch", lambda: pickle.dumps(EpisodeBatch(episodes)), lambda: tuple(pickle.loads(data))),
        (
            "batch columns",
            lambda: pickle.dumps(EpisodeBatch(episodes)),
            lambda: pickle.loads(data).columns(),
        ),
    )
    buffer = ReplayBuffer()
    buffer.add_many(episodes)
    state = buffer.state_dict()
    state_data = pickle.dumps(state)
    snap_data = pickle.dumps(BufferSnapshot(state, ()))
    forms += (
        (
            "state dict",
            functools.partial(pickle.dumps, state),
            functools.partial(pickle.loads, state_data),
        ),
        (
            "snapshot",
            lambda: pickle.dumps(BufferSnapshot(state, ())),
            functools.partial(pickle.loads, snap_data),
        ),
    )
    raw = _raw(episodes)
    forms += (
        (
            "built by episode",
            lambda: pickle.dumps(_by_episode(raw)),
            lambda: pickle.loads(data).columns(),
        ),
        (
            "built by columns",
            lambda: pickle.dumps(_by_columns(raw)),
            lambda: pickle.loads(data).columns(),
        ),
    )
    sent = {"list": episodes, "state dict": state, "snapshot": BufferSnapshot(state, ())}
    for form, dumps, loads in forms:
        size = len(pickle.dumps(sent.get(form, EpisodeBatch(episodes))))
        rows.append(
            Row(
                episodes=n,
                form=form,
                dumps_ms=_cpu_ms(dumps, rounds, reps),
                loads_ms=_cpu_ms(loads, rounds, reps),
                bytes=size,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 episodes only, 2 rounds")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.manual_seed(0)
    sizes = [128] if args.quick else [64, 128, 1024]
    rows = [row for n in sizes for row in measure(n, 2 if args.quick else 5)]
    print(f"{'episodes':>8}  {'form':<16}  {'dumps ms':>9}  {'loads ms':>9}  {'bytes':>9}")
    for row in rows:
        print(
            f"{row.episodes:>8}  {row.form:<16}  {row.dumps_ms:>9.3f}  {row.loads_ms:>9.3f}  "
            f"{row.bytes:>9}"
        )
    for n in sizes:
        plain, batch, cols, state, snap, by_episode, by_columns = (
            r for r in rows if r.episodes == n
        )
        dumps = plain.dumps_ms / batch.dumps_ms
        print(
            f"{n} episodes: list / EpisodeBatch CPU time, dumps {dumps:.2f}x, "
            f"loads {plain.loads_ms / batch.loads_ms:.2f}x (episodes read), "
            f"{plain.loads_ms / cols.loads_ms:.2f}x (columns read); state dict / snapshot, "
            f"dumps {state.dumps_ms / snap.dumps_ms:.2f}x, "
            f"loads {state.loads_ms / snap.loads_ms:.2f}x; built and dumped by episode / by "
            f"columns {by_episode.dumps_ms / by_columns.dumps_ms:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
