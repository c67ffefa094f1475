"""Finding the model: a local directory or a cached hub id; never the network."""

import socket
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
from async_grpo.cli.main import main
from async_grpo.model.locate import ModelNotFound, locate_model
from jobs import refuse_spawn

MISSING_ID = "monarch-rl-tests/no-such-model"


def closed_port() -> int:
    """A local TCP port nothing listens on (connecting to it is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    # Any request would go to a port that refuses it: the tests would see it fail.
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


def test_local_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert locate_model(str(tmp_path)) == str(tmp_path)


def test_a_directory_without_a_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"no config\.json there"):
        locate_model(str(tmp_path))


def test_missing_path_is_not_taken_for_a_hub_id(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no such directory"):
        locate_model(str(tmp_path / "nope"))


def test_an_uncached_hub_id_says_how_to_download_it_and_downloads_nothing(
    empty_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.perf_counter()
    status = main(
        ["--preset", "qwen2.5-0.5b", "--device", "cpu", "--out_dir", str(empty_cache / "out")],
        spawn=refuse_spawn,
    )
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err
    assert "'Qwen/Qwen2.5-0.5B-Instruct' is not a local directory" in err
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR" in err
    assert "--model DIR" in err
    assert elapsed < 10, elapsed  # no request, no retries
    assert not any(empty_cache.iterdir())  # nothing was downloaded into the cache


def test_a_cached_hub_id_is_its_snapshot_directory(empty_cache: Path) -> None:
    repo = empty_cache / "models--monarch-rl-tests--no-such-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert locate_model(MISSING_ID) == str(snapshot)
