"""Where replicas run: which host each replica slot is on, which hosts are down, and which
GPUs a slot uses on its host. Pure bookkeeping (no Monarch), so it is tested on its own.

Hosts are numbered 0..n-1 in the order the service was given them. Replica `i` starts on
host `i % n` (round-robin). A restart tries the replica's own host first, then the other
hosts that are up, fewest replicas first (ties in host order), so that replicas from a dead
host spread over the survivors instead of piling onto the next one. A host is marked down
when a replica's processes fail to spawn there (or give no answer within
`spawn_timeout_s`), and skipped while any host is up; when every
host is down, all are tried again (own host first), since nothing else can work, and a host
where a spawn succeeds is up again.
"""

from __future__ import annotations


class Placement:
    """The host of each of `replicas` slots over `hosts` hosts, and their GPU blocks.

    With `with_gpus`, a slot's processes use the GPUs of one *block* on its host: block `b`
    is the `b`-th run of `procs_per_replica * gpus_per_proc` GPUs after `first_gpu`. A slot
    keeps its block while it stays on its host (a restart reuses the same GPUs) and takes the
    lowest block free on a host it moves to.
    """

    def __init__(self, hosts: int, replicas: int) -> None:
        if hosts < 1:
            raise ValueError(f"a placement needs at least one host, got {hosts}")
        self.hosts = hosts
        self.host_of = [i % hosts for i in range(replicas)]
        self.block_of = [i // hosts for i in range(replicas)]
        self.down: set[int] = set()

    def candidates(self, replica: int) -> list[int]:
        """Hosts to try, in order, to restart slot `replica` (see the module docstring)."""
        own = self.host_of[replica]
        load = [0] * self.hosts
        for index, host in enumerate(self.host_of):
            if index != replica:
                load[host] += 1
        others = sorted((h for h in range(self.hosts) if h != own), key=lambda h: (load[h], h))
        ordered = [own, *others]
        up = [h for h in ordered if h not in self.down]
        return up or ordered

    def block_on(self, replica: int, host: int) -> int:
        """The GPU block slot `replica` uses on `host`: its own on its host, else the lowest
        block no other slot on `host` uses."""
        if self.host_of[replica] == host:
            return self.block_of[replica]
        taken = {self.block_of[i] for i, h in enumerate(self.host_of) if h == host}
        return next(b for b in range(len(self.host_of)) if b not in taken)

    def move(self, replica: int, host: int) -> None:
        """Slot `replica` now runs on `host` (with the block `block_on` gives)."""
        self.block_of[replica] = self.block_on(replica, host)
        self.host_of[replica] = host

    def mark_down(self, host: int) -> None:
        self.down.add(host)

    def mark_up(self, host: int) -> None:
        self.down.discard(host)
