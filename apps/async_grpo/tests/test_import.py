import importlib.metadata

import async_grpo


def test_version_matches_distribution() -> None:
    assert async_grpo.__version__ == importlib.metadata.version("async-grpo")
