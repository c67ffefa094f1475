import importlib.metadata

import replay_buffer


def test_version_matches_distribution() -> None:
    assert replay_buffer.__version__ == importlib.metadata.version("replay-buffer")
