"""Finding the checkpoint fails fast and names what was tried (no minute-long hub retries)."""

import socket
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
from async_grpo.cli.main import main
from async_grpo.model.locate import CheckpointNotFound, locate_checkpoint

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
    return cache


def test_local_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert locate_checkpoint(str(tmp_path)) == str(tmp_path)


def test_missing_path_is_not_taken_for_a_hub_id(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFound, match="no such directory"):
        locate_checkpoint(str(tmp_path / "nope"))


def test_offline_hub_id_fails_at_once(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Any request would go to a port that refuses it; none should be made.
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.perf_counter()
    status = main(["--preset", "qwen2.5-0.5b", "--out_dir", str(empty_cache / "out")])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert status == 2
    assert "'Qwen/Qwen2.5-0.5B-Instruct'" in err
    assert "HF_HUB_OFFLINE is set" in err
    assert "--preset tiny" in err
    assert elapsed < 10, elapsed  # was ~100 s of hub retries before the check existed


def test_unreachable_hub_fails_after_one_request(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.perf_counter()
    with pytest.raises(CheckpointNotFound, match=r"not cached, and the hub said: .*Connect"):
        locate_checkpoint(MISSING_ID, timeout_s=2.0)
    assert time.perf_counter() - start < 10


def test_cached_hub_id_needs_no_network(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = empty_cache / "models--monarch-rl-tests--no-such-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert locate_checkpoint(MISSING_ID) == MISSING_ID
