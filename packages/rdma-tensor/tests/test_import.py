import importlib.metadata

import rdma_tensor


def test_version_matches_distribution() -> None:
    assert rdma_tensor.__version__ == importlib.metadata.version("rdma-tensor")
