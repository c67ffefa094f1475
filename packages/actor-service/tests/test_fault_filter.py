"""`FaultFilter`: drops the failures it expects and passes every other one down the chain of
hooks exactly once, however often it and other filters were installed (no processes: the
hooks are called directly, as Monarch calls them)."""

from __future__ import annotations

from typing import cast

import monarch.actor
import pytest
from actor_service import FaultFilter
from monarch.actor import MeshFailure


class Failure:
    """Stands in for a `MeshFailure`: the filters read only its mesh name and its text."""

    def __init__(self, mesh_name: str) -> None:
        self.mesh_name = mesh_name

    def __str__(self) -> str:
        return f"MeshFailure(mesh_name={self.mesh_name})"


def failure(mesh_name: str) -> MeshFailure:
    return cast(MeshFailure, Failure(mesh_name))


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The mesh names of the failures that reach the bottom of the chain (Monarch's default
    hook, which would exit the process)."""
    seen: list[str] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", lambda f: seen.append(f.mesh_name))
    return seen


def starts(prefix: str) -> FaultFilter:
    return FaultFilter(prefix, lambda f: f.mesh_name.startswith(prefix))


def test_drops_what_it_expects_and_passes_the_rest_on(reached: list[str]) -> None:
    starts("trainer").install()
    for name in ("trainer-1", "generator-1", "trainer-2", "buffer-1"):
        monarch.actor.unhandled_fault_hook(failure(name))
    assert reached == ["generator-1", "buffer-1"]


def test_installing_twice_in_a_row_is_one_filter(reached: list[str]) -> None:
    f = starts("trainer")
    f.install()
    f.install()
    assert monarch.actor.unhandled_fault_hook is f
    monarch.actor.unhandled_fault_hook(failure("generator-1"))
    assert reached == ["generator-1"]


def test_reinstalled_over_a_hand_written_filter_every_failure_goes_down_once(
    reached: list[str],
) -> None:
    # The app's trainer filter, then a test's hand-written one in front of it, then the
    # trainer filter again (a second run in the same process): the chain is trainer ->
    # hand-written -> trainer -> default, and must not loop.
    trainer = starts("trainer")
    trainer.install()
    below = monarch.actor.unhandled_fault_hook

    def hand_written(failure: MeshFailure) -> None:
        if "probe" not in failure.mesh_name:
            below(failure)

    monarch.actor.unhandled_fault_hook = hand_written
    trainer.install()
    for name in ("generator-1", "probe-1", "trainer-1", "generator-2"):
        monarch.actor.unhandled_fault_hook(failure(name))
    assert reached == ["generator-1", "generator-2"]


def test_two_filters_installed_in_turns(reached: list[str]) -> None:
    # As the app does with its trainer filter and the services' filter, run after run.
    a, b = starts("a-"), starts("b-")
    for _ in range(3):
        a.install()
        b.install()
    for name in ("a-1", "b-1", "c-1", "a-2", "c-2"):
        monarch.actor.unhandled_fault_hook(failure(name))
    assert reached == ["c-1", "c-2"]


def test_a_failure_raised_below_leaves_the_filter_ready_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Monarch's default hook ends the process by raising KeyboardInterrupt in the main
    # thread; a filter that caught nothing must still count its next failure from the top.
    calls: list[str] = []

    def default(f: MeshFailure) -> None:
        calls.append(f.mesh_name)
        raise KeyboardInterrupt

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", default)
    trainer = starts("trainer")
    trainer.install()
    below = monarch.actor.unhandled_fault_hook

    def passes_on(failure: MeshFailure) -> None:  # another program's filter, in front
        below(failure)

    monarch.actor.unhandled_fault_hook = passes_on
    trainer.install()
    for name in ("generator-1", "generator-2"):
        with pytest.raises(KeyboardInterrupt):
            monarch.actor.unhandled_fault_hook(failure(name))
    assert calls == ["generator-1", "generator-2"]
