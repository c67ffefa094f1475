"""Which host each replica runs on, and where a replica goes when its host is down
(pure bookkeeping, no Monarch)."""

from __future__ import annotations

import pytest
from actor_service._placement import Placement


def test_replicas_start_round_robin_and_take_gpu_blocks_per_host() -> None:
    p = Placement(hosts=2, replicas=5)
    assert p.host_of == [0, 1, 0, 1, 0]
    assert p.block_of == [0, 0, 1, 1, 2]


def test_a_single_host_keeps_today_s_gpu_layout() -> None:
    p = Placement(hosts=1, replicas=3)
    assert (p.host_of, p.block_of) == ([0, 0, 0], [0, 1, 2])
    assert p.candidates(1) == [0]


def test_a_restart_tries_its_own_host_first_then_the_least_loaded() -> None:
    p = Placement(hosts=3, replicas=5)  # hosts hold replicas [0, 3], [1, 4], [2]
    assert p.candidates(0) == [0, 2, 1]  # host 2 has one replica, host 1 two
    assert p.candidates(2) == [2, 0, 1]  # ties in host order


def test_down_hosts_are_skipped_unless_every_host_is_down() -> None:
    p = Placement(hosts=3, replicas=3)
    p.mark_down(0)
    assert p.candidates(0) == [1, 2]
    p.mark_down(1)
    p.mark_down(2)
    assert p.candidates(0) == [0, 1, 2]  # nothing is up: try them all, own host first
    p.mark_up(2)
    assert p.candidates(0) == [2]


def test_a_moved_replica_takes_the_lowest_free_block_and_keeps_it() -> None:
    p = Placement(hosts=2, replicas=4)  # host 0: replicas 0, 2 (blocks 0, 1); host 1: 1, 3
    assert p.block_on(0, 0) == 0  # staying: its own block
    assert p.block_on(0, 1) == 2  # blocks 0 and 1 of host 1 are taken
    p.move(0, 1)
    assert (p.host_of[0], p.block_of[0]) == (1, 2)
    p.move(2, 1)  # host 1 now holds blocks 0, 1, 2
    assert p.block_of[2] == 3
    p.move(0, 0)  # back on an empty host 0: block 0 again
    assert (p.host_of[0], p.block_of[0]) == (0, 0)
    p.move(0, 0)
    assert p.block_of[0] == 0


def test_no_host_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        Placement(hosts=0, replicas=1)
