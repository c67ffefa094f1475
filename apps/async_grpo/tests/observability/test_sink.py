"""`MetricsSink`'s index of where each version's rows end: a checkpoint copies the rows up
to its version from a prefix of each file, and a rewind rebuilds the index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from async_grpo.observability.metrics import StepRow
from async_grpo.observability.sink import MetricsSink, rows_up_to
from synthetic_runs import step_row


def row(version: int) -> StepRow:
    # A string field with non-ASCII text: json.dumps escapes it, so lengths stay byte counts.
    return StepRow(**step_row(version=version, loss=0.5 * version, weight_sync_transport="tcp é"))


def up_to(sink: MetricsSink, version: int) -> tuple[str, str]:
    metrics_end, prompts_end = sink.ends_at(version)
    return rows_up_to(sink.path, metrics_end), rows_up_to(sink.prompts_path, prompts_end)


def versions(text: str) -> list[int]:
    return [json.loads(line)["version"] for line in text.splitlines()]


def test_the_rows_up_to_a_version_are_a_prefix_of_each_file(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path)
    for v in (1, 2, 3, 4, 5):
        sink.write(row(v), prompts=[10 * v, 10 * v + 1])
    metrics, prompts = up_to(sink, 3)
    assert versions(metrics) == [1, 2, 3]
    assert versions(prompts) == [1, 2, 3]
    assert json.loads(prompts.splitlines()[2]) == {"version": 3, "prompts": [30, 31]}
    assert json.loads(metrics.splitlines()[2])["weight_sync_transport"] == "tcp é"
    # The same text the files hold up to there: a checkpoint's copy resumes byte for byte.
    full = sink.path.read_text(encoding="utf-8")
    assert full.startswith(metrics)
    assert versions(full) == [1, 2, 3, 4, 5]
    assert up_to(sink, 0) == ("", "")
    assert up_to(sink, 99) == (full, sink.prompts_path.read_text(encoding="utf-8"))
    sink.close()


def test_a_rewind_rebuilds_the_index_from_the_checkpoints_rows(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path)
    for v in (1, 2, 3, 4):
        sink.write(row(v), prompts=[v])
    metrics, prompts = up_to(sink, 2)
    sink.rewind(metrics, prompts)  # a restore at version 2
    sink.write(row(3), prompts=[33])  # version 3 again, after the cut
    assert versions(sink.path.read_text(encoding="utf-8")) == [1, 2, 3]
    metrics, prompts = up_to(sink, 3)
    assert versions(metrics) == [1, 2, 3]
    assert json.loads(prompts.splitlines()[-1]) == {"version": 3, "prompts": [33]}
    assert versions(up_to(sink, 1)[0]) == [1]
    sink.rewind("", "")  # restored at the run's start
    assert up_to(sink, 5) == ("", "")
    sink.close()


def test_rows_out_of_version_order_are_refused(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path)
    sink.write(row(2))
    with pytest.raises(ValueError, match="version 2 after version 2"):
        sink.write(row(2))
    assert versions(sink.path.read_text(encoding="utf-8")) == [2]  # nothing half-written
    sink.close()


def test_a_checkpoints_rows_that_do_not_pair_up_are_refused(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path)
    sink.write(row(1), prompts=[1])
    before = sink.path.read_text(encoding="utf-8")
    metrics = json.dumps(step_row(version=1)) + "\n"
    with pytest.raises(ValueError, match=r"metrics rows \(1\) and prompt rows \(0\)"):
        sink.rewind(metrics, "")
    assert sink.path.read_text(encoding="utf-8") == before  # nothing rewound
    assert versions(up_to(sink, 1)[0]) == [1]
    sink.close()


@pytest.mark.parametrize(
    ("metrics", "prompts", "message"),
    [
        ([1, 2], [1, 3], "metrics row 2 is of version 2, its prompt row 2 of version 3"),
        ([2, 1], [2, 1], "row 2 is of version 1, after version 2"),
        ([1, 1], [1, 1], "row 2 is of version 1, after version 1"),
    ],
)
def test_a_checkpoints_rows_of_other_versions_or_out_of_order_are_refused(
    tmp_path: Path, metrics: list[int], prompts: list[int], message: str
) -> None:
    sink = MetricsSink(tmp_path)
    sink.write(row(1), prompts=[1])
    before = sink.path.read_text(encoding="utf-8")
    text = "".join(json.dumps(step_row(version=v)) + "\n" for v in metrics)
    prompt_text = "".join(json.dumps({"version": v, "prompts": []}) + "\n" for v in prompts)
    with pytest.raises(ValueError, match=message):
        sink.rewind(text, prompt_text)
    assert sink.path.read_text(encoding="utf-8") == before  # nothing rewound
    sink.close()


def test_a_checkpoints_row_that_is_not_json_is_named(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path)
    good = json.dumps({"version": 1, "prompts": []}) + "\n"
    with pytest.raises(ValueError, match="metrics row 1 is not a JSON row with a version"):
        sink.rewind("{not json\n", good)
    with pytest.raises(ValueError, match="prompt row 1 has version '1'"):
        sink.rewind(json.dumps(step_row(version=1)) + "\n", '{"version": "1"}\n')
    with pytest.raises(ValueError, match="prompt row 1 has version True"):
        sink.rewind(json.dumps(step_row(version=1)) + "\n", '{"version": true}\n')
    sink.close()
