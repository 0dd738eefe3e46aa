"""``benchmarks/common/records.py``: a record is ``<name>.json`` plus ``<name>.md`` in the output folder."""

import json

from benchmarks.common.records import write_json, write_record


def test_write_record_writes_json_and_markdown_and_prints(tmp_path, capsys):
    out = tmp_path / "results"  # created when missing
    write_record(str(out), "x_1", {"a": 1, "nested": {"b": [1, 2]}}, "# x\n")
    assert json.loads((out / "x_1.json").read_text()) == {"a": 1, "nested": {"b": [1, 2]}}
    assert (out / "x_1.md").read_text() == "# x\n" and "# x" in capsys.readouterr().out
    assert write_json(str(out), "x_1", {"a": 2}).endswith("x_1.json")  # partial saves overwrite the JSON only
    assert json.loads((out / "x_1.json").read_text()) == {"a": 2} and (out / "x_1.md").read_text() == "# x\n"


def test_write_record_returns_both_paths_and_prints_only_when_asked(tmp_path, capsys):
    paths = write_record(str(tmp_path), "quiet", [1, 2], "# quiet\n", echo=False)
    assert paths == [str(tmp_path / "quiet.json"), str(tmp_path / "quiet.md")] and capsys.readouterr().out == ""
