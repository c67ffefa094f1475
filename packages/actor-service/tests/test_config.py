from __future__ import annotations

import dataclasses

import pytest
from actor_service import RoundRobin, ServiceConfig


def test_defaults_are_valid_and_routers_are_per_config() -> None:
    a, b = ServiceConfig(), ServiceConfig()
    assert a.replicas == 1
    assert a.router is not b.router


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("replicas", 0),
        ("procs_per_replica", -1),
        ("max_in_flight_per_replica", 0),
        ("max_queued", -1),
        ("max_retries", 1.5),
        ("max_restarts", -2),
        ("restart_backoff_s", 0),
        ("no_healthy_timeout_s", float("inf")),
        ("start_timeout_s", -1.0),
        ("spawn_timeout_s", 0),
        ("stop_timeout_s", float("nan")),
        ("drain_timeout_s", "1s"),
        ("router", "round_robin"),
        ("non_idempotent", ["charge"]),
        ("name", "my service"),
        ("call_timeout_s", 0),
        ("call_timeout_s", -1.0),
        ("call_timeout_s", float("nan")),
        ("call_timeout_s", float("inf")),
        ("call_timeout_s", "5"),
        ("call_timeout_s", True),
        ("endpoint_timeouts", (("generate", 0.0),)),
        ("endpoint_timeouts", (("generate", float("nan")),)),
        ("endpoint_timeouts", (("generate", "5"),)),
        ("endpoint_timeouts", (("generate",),)),
        ("endpoint_timeouts", ((1, 5.0),)),
        ("endpoint_timeouts", {"generate": 5.0}),
        ("endpoint_timeouts", (("generate", 5.0), ("generate", 6.0))),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"ServiceConfig.{field} must be"):
        ServiceConfig(**{field: value})  # type: ignore[arg-type]


def test_backoff_cap_must_not_be_below_the_first_delay() -> None:
    with pytest.raises(ValueError, match="restart_backoff_max_s"):
        ServiceConfig(restart_backoff_s=2.0, restart_backoff_max_s=1.0)


def test_from_dict_rejects_unknown_keys_and_accepts_lists() -> None:
    cfg = ServiceConfig.from_dict({"replicas": 3, "non_idempotent": ["charge"]})
    assert cfg.replicas == 3
    assert cfg.non_idempotent == ("charge",)
    with pytest.raises(ValueError, match=r"unknown ServiceConfig keys \['replica'\]"):
        ServiceConfig.from_dict({"replica": 3})


def test_config_is_frozen() -> None:
    cfg = ServiceConfig(router=RoundRobin())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.replicas = 4  # type: ignore[misc]


def test_restart_delay_doubles_up_to_the_cap() -> None:
    cfg = ServiceConfig(restart_backoff_s=0.5, restart_backoff_max_s=3.0)
    assert [cfg.restart_delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_timeouts_per_endpoint_replace_the_default() -> None:
    cfg = ServiceConfig(call_timeout_s=5, endpoint_timeouts=(("generate", 120.0),))
    assert cfg.timeout_for("generate") == 120.0
    assert cfg.timeout_for("ping") == 5.0
    assert ServiceConfig().timeout_for("ping") is None
    only = ServiceConfig(endpoint_timeouts=(("ping", 1.5),))
    assert (only.timeout_for("ping"), only.timeout_for("generate")) == (1.5, None)


def test_from_dict_accepts_endpoint_timeouts_as_a_table_or_pairs() -> None:
    table = ServiceConfig.from_dict({"endpoint_timeouts": {"generate": 120.0, "ping": 5}})
    assert dict(table.endpoint_timeouts) == {"generate": 120.0, "ping": 5}
    pairs = ServiceConfig.from_dict({"endpoint_timeouts": [["generate", 120.0]]})
    assert pairs.endpoint_timeouts == (("generate", 120.0),)
    with pytest.raises(ValueError, match=r"ServiceConfig\.endpoint_timeouts must be"):
        ServiceConfig.from_dict({"endpoint_timeouts": {"generate": -1}})


def test_gpu_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="gpus_per_proc must be an int >= 1"):
        ServiceConfig(gpus_per_proc=0)
    with pytest.raises(ValueError, match="first_gpu must be an int >= 0"):
        ServiceConfig(first_gpu=-1)
