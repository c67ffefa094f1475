import importlib.metadata

import dtensor_reshard


def test_version_matches_distribution() -> None:
    assert dtensor_reshard.__version__ == importlib.metadata.version("dtensor-reshard")
