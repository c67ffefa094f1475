"""Manifests pickle their publisher's layout and slots as one blob, decoded once per
process: round trips stay exact, and two publishers never share a decoding."""

from __future__ import annotations

import pickle

from rdma_tensor import Publisher, PublisherConfig
from sync_actors import version_state


def test_manifests_round_trip_and_reuse_the_decoded_layout() -> None:
    first, second = Publisher(PublisherConfig(bucket_bytes=16 << 10)), Publisher()
    try:
        a1 = first.publish(version_state(1), 1)
        a2 = first.publish(version_state(2), 2)
        b1 = second.publish(version_state(1), 1)
        assert a1.slots is a2.slots  # one tuple per publisher: pickled once
        got = [pickle.loads(pickle.dumps(m)) for m in (a1, a2, b1)]
        assert got == [a1, a2, b1]
        assert [m.version for m in got] == [1, 2, 1]
        assert got[0].bucket_layout is got[1].bucket_layout  # decoded once, shared
        assert got[0].bucket_layout is not got[2].bucket_layout
        assert len(got[0].bucket_layout.bucket_nbytes) > 1
        assert len(got[2].bucket_layout.bucket_nbytes) == 1
        relayed = pickle.loads(pickle.dumps(got[1]))  # a relaying process re-sends as is
        assert relayed == a2
    finally:
        first.close()
        second.close()
