"""ReplayBufferConfig validation: bad values and inconsistent combinations are refused."""

from __future__ import annotations

from typing import Any

import pytest
from replay_buffer import ReplayBufferConfig


def test_defaults_describe_an_unbounded_use_once_fifo_buffer() -> None:
    config = ReplayBufferConfig()
    assert config.max_policy_age is None
    assert config.max_buffer_size is None
    assert config.max_resample_count == 0
    assert config.admission_limit is None
    assert config.group_size is None
    assert config.dp_size == 1
    assert config.sampling == "fifo"
    assert config.episodes_per_item == 1
    assert ReplayBufferConfig(group_size=4).episodes_per_item == 4


def test_unknown_key_is_an_error() -> None:
    with pytest.raises(TypeError, match="max_age"):
        ReplayBufferConfig(**{"max_age": 1})  # type: ignore[arg-type]


BAD = [
    ({"max_policy_age": -1}, ValueError, "max_policy_age must be >= 0"),
    ({"max_policy_age": 1.5}, TypeError, "max_policy_age must be an int or None"),
    ({"max_buffer_size": 0}, ValueError, "max_buffer_size must be >= 1"),
    ({"max_resample_count": -1}, ValueError, "max_resample_count must be >= 0"),
    ({"max_resample_count": None}, TypeError, "max_resample_count must be an int"),
    ({"admission_limit": 0}, ValueError, "admission_limit must be >= 1"),
    ({"group_size": 0}, ValueError, "group_size must be >= 1"),
    ({"dp_size": 0}, ValueError, "dp_size must be >= 1"),
    ({"dp_size": True}, TypeError, "dp_size must be an int"),
    ({"seed": "0"}, TypeError, "seed must be an int"),
    ({"sampling": "lifo"}, ValueError, "sampling must be one of"),
    (
        {"max_buffer_size": 10, "admission_limit": 11},
        ValueError,
        "admission_limit (11) must not exceed max_buffer_size (10)",
    ),
    (
        {"max_buffer_size": 3, "group_size": 4},
        ValueError,
        "max_buffer_size (3) must be at least group_size (4)",
    ),
    (
        {"admission_limit": 3, "group_size": 4},
        ValueError,
        "admission_limit (3) must be at least group_size (4)",
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD)
def test_bad_config_is_refused_by_name(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        ReplayBufferConfig(**kwargs)
    assert message in str(info.value)


def test_negative_seed_is_allowed() -> None:
    assert ReplayBufferConfig(seed=-3).seed == -3
