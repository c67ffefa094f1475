"""`observability.crashes`: where a crashed process was, read from the stacks it wrote."""

from pathlib import Path

from async_grpo.observability.crashes import (
    crash_dir,
    crash_note,
    innermost_crash_frame,
    read_crashes,
    remove_empty,
    stacks_under,
)

# As faulthandler writes it with all_threads (Python 3.11): the other threads first here, the
# crashing one marked "Current thread", innermost frame first, then the extension modules.
STACKS = """Fatal Python error: Aborted

Thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/threading.py", line 331 in wait
  File "/repo/apps/async_grpo/src/async_grpo/tracing/tracer.py", line 210 in _flush_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d.py", line 3 in all_gather
  File "/repo/packages/dtensor-reshard/src/dtensor_reshard/gather.py", line 88 in full_tensor
  File "/repo/apps/async_grpo/src/async_grpo/actors/trainer.py", line 150 in full_weights
  File "/venv/lib/python3.11/site-packages/monarch/_src/actor/actor_mesh.py", line 1777 in handle

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_the_crashing_threads_innermost_project_frame() -> None:
    # Not the torch frame above it, nor the tracer thread printed first.
    assert innermost_crash_frame(STACKS) == "full_tensor (dtensor_reshard/gather.py:88)"


def test_without_project_code_its_innermost_frame_and_without_frames_nothing() -> None:
    only_library = "\n".join(x for x in STACKS.splitlines() if "/repo/" not in x)
    assert innermost_crash_frame(only_library) == "all_gather (torch/distributed/c10d.py:3)"
    stdlib = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/selectors.py", line 468 in select\n'
    )
    assert innermost_crash_frame(stdlib) == "select (python3.11/selectors.py:468)"
    assert innermost_crash_frame("Fatal Python error: Aborted\n") == ""


def test_read_by_pid_and_named_in_the_death_line(tmp_path: Path) -> None:
    folder = crash_dir(tmp_path)
    folder.mkdir()
    (folder / "trainer-101.txt").write_text(STACKS)
    (folder / "generator-102.txt").write_text("")  # alive, or SIGKILLed: nothing written
    (folder / "generator-1010.txt").write_text(STACKS)  # another pid ending in the same digits
    assert read_crashes(tmp_path, [102, 103]) == []
    (report,) = read_crashes(tmp_path, [101, 102])
    assert (report.pid, report.error) == (101, "Fatal Python error: Aborted")
    assert report.path == folder / "trainer-101.txt"
    assert crash_note([report]) == (
        "; pid 101 crashed in full_tensor (dtensor_reshard/gather.py:88) (Fatal Python error: "
        f"Aborted), stacks in {folder / 'trainer-101.txt'}"
    )
    assert crash_note([]) == ""


def test_the_empty_files_go_at_the_end_and_the_folder_with_them(tmp_path: Path) -> None:
    folder = crash_dir(tmp_path)
    remove_empty(tmp_path)  # no folder: nothing to do
    folder.mkdir()
    (folder / "reward-7.txt").write_text("")
    (folder / "trainer-8.txt").write_text(STACKS)
    remove_empty(tmp_path)
    assert [p.name for p in folder.iterdir()] == ["trainer-8.txt"]
    (folder / "trainer-8.txt").write_text("")
    remove_empty(tmp_path)
    assert not folder.exists()


def test_the_stacks_anywhere_under_a_tests_folder(tmp_path: Path) -> None:
    # What a failed test's report shows (`tests/conftest.py`): every run's, the empty skipped.
    for run, text in (("first", STACKS), ("second", ""), ("second/nested", "x")):
        folder = crash_dir(tmp_path / run)
        folder.mkdir(parents=True)
        (folder / "buffer-5.txt").write_text(text)
    (tmp_path / "first" / "notes.txt").write_text("not a crash file")
    found = stacks_under(tmp_path)
    assert [(r.path.relative_to(tmp_path).as_posix(), r.error) for r in found] == [
        ("first/crashes/buffer-5.txt", "Fatal Python error: Aborted"),
        ("second/nested/crashes/buffer-5.txt", "x"),
    ]
