"""Endpoint tables, names and handles, without Monarch processes."""

from __future__ import annotations

import pickle

import pytest
from actor_service import ServiceHandle, non_idempotent
from actor_service.endpoint import endpoint_name, endpoint_table
from service_actors import Echo, Parallel


def test_non_idempotent_names_must_be_endpoints() -> None:
    with pytest.raises(ValueError, match=r"names \['nope'\], which are not endpoints of Echo"):
        endpoint_table(Echo, ("nope",))
    table = endpoint_table(Echo, ("transfer",))
    assert table["charge"] is False  # @non_idempotent
    assert table["transfer"] is False  # from the config
    assert table["echo"] is True


def test_non_idempotent_decorator_goes_above_endpoint() -> None:
    def plain(self: object) -> None: ...

    with pytest.raises(TypeError, match="goes above @endpoint"):
        non_idempotent(plain)


def test_endpoint_names_from_class_attributes() -> None:
    assert endpoint_name(Echo.echo) == "echo"
    assert endpoint_name(Parallel.work) == "work"  # a @concurrent_endpoint
    assert endpoint_name("echo") == "echo"
    with pytest.raises(TypeError, match="expected an endpoint"):
        endpoint_name(42)


def test_handle_pickles_with_its_endpoints() -> None:
    handle = ServiceHandle(None, "policy", {"generate": True, "train": False}, True)
    copy = pickle.loads(pickle.dumps(handle))
    assert copy.name == "policy"
    assert copy.generate.name == "generate"
    assert copy.endpoint("train").name == "train"
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        copy.nope  # noqa: B018
    assert copy.session().key != copy.session().key


def test_handle_session_needs_a_session_router() -> None:
    handle = ServiceHandle(None, "policy", {"generate": True}, False)
    with pytest.raises(ValueError, match="does not keep sessions"):
        handle.session()
