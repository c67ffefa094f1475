import importlib.metadata

import actor_service


def test_version_matches_distribution() -> None:
    assert actor_service.__version__ == importlib.metadata.version("actor-service")
