"""benchmarks/check_records.py: the repository's BENCHMARKS.md agrees with its records, and each kind of
disagreement is caught on a small broken copy."""

import pathlib

import pytest

from benchmarks import ROOT, check_records

HEADER = """# Benchmarks

## Summary

| figure (issue) | target | result | machine load | command · status |
|---|---|---|---|---|
"""


def _repo(tmp_path: pathlib.Path, rows: str, record: str = "", extra: str = "") -> pathlib.Path:
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "ce_retrieval" / "losses").mkdir(parents=True)
    (tmp_path / "ce_retrieval" / "__init__.py").write_text("")
    (tmp_path / "ce_retrieval" / "losses" / "__init__.py").write_text("")
    (tmp_path / "ce_retrieval" / "losses" / "fast_paths.py").write_text("")
    (tmp_path / "benchmarks" / "results" / "r.md").write_text(record)
    (tmp_path / "BENCHMARKS.md").write_text(HEADER + rows + "\n## Section one\n" + extra)
    return tmp_path


GOOD_ROW = (
    "| loss cost (#2) | ≤ 1.3× | 1.00× eager, 0.88× graph; 10,228 requests | idle "
    "| `b.py` · **met** ([record](benchmarks/results/r.md)) |\n"
)
GOOD_RECORD = (
    "Measured 2026-11-25 on 2 cores, load 1.2. eager 1.003x, graph 0.876x; answered 10228\n"
    "Mining: `ce_retrieval/losses/fast_paths.py`, `ce_retrieval.losses.Foo`\n"
)
SELECTION = "names 'ce_retrieval/losses/selection.py'"


def test_the_repository_passes():
    assert check_records.check(ROOT) == []
    assert check_records.main(["--root", str(ROOT)]) == 0


def test_a_consistent_copy_passes_and_rows_can_share_or_be_history(tmp_path):
    rows = GOOD_ROW + "| same, other size | ≤ 2× | 0.88× | idle | same · **met** |\n"
    rows += "| old (#5) | ≥ 100× | 250× | idle | `ann.py` · **met on 2026-11-22 — history**, no record |\n"
    assert check_records.check(_repo(tmp_path, rows, GOOD_RECORD, "[sec](#section-one)")) == []


@pytest.mark.parametrize(
    ("rows", "record", "extra", "expected"),
    [
        (GOOD_ROW.replace(" ([record](benchmarks/results/r.md))", ""), GOOD_RECORD, "", "links no record"),
        (GOOD_ROW.replace("0.88×", "0.87×"), GOOD_RECORD, "", "figure '0.87' is in none"),
        (GOOD_ROW.replace("10,228", "10,229"), GOOD_RECORD, "", "figure '10,229' is in none"),
        (GOOD_ROW.replace("r.md", "gone.md"), GOOD_RECORD, "", "does not exist"),
        (GOOD_ROW, GOOD_RECORD.replace("Measured 2026-11-25 on 2 cores, load 1.2. ", ""), "", "states no date"),
        (GOOD_ROW, GOOD_RECORD.replace(", load 1.2", ""), "", "says nothing of the load"),
        (GOOD_ROW, GOOD_RECORD.replace(" on 2 cores", ""), "", "names no machine"),
        (
            GOOD_ROW,
            GOOD_RECORD.replace("fast_paths.py", "selection.py"),
            "",
            "names 'ce_retrieval/losses/selection.py'",
        ),
        (GOOD_ROW, GOOD_RECORD.replace("losses.Foo", "lossez.Foo"), "", "names 'ce_retrieval.lossez.Foo'"),
        (GOOD_ROW, GOOD_RECORD, "[plot](benchmarks/results/p.png)", "link to 'benchmarks/results/p.png'"),
        (GOOD_ROW, GOOD_RECORD, "[sec](#section-two)", "link to '#section-two'"),
        (GOOD_ROW + "| old | t | 250× | idle | `a.py` · **met on 2026-11-22** |\n", GOOD_RECORD, "", "links no record"),
    ],
)
def test_each_kind_of_disagreement_is_reported(tmp_path, rows, record, extra, expected):
    problems = check_records.check(_repo(tmp_path, rows, record, extra))
    assert any(expected in p for p in problems), problems
    assert check_records.main(["--root", str(tmp_path)]) == 1


def test_figures_match_at_the_precision_shown():
    numbers = check_records.record_numbers("p = 1.72e-05, gain 5.184, share 0.303, 12,559 images")
    for token in ("1.7e-5", "5.18", "5.2", "12,559", "12559"):
        assert check_records.contains(numbers, token, json_record=False), token
    for token in ("1.8e-5", "5.19", "30.3", "12,560"):
        assert not check_records.contains(numbers, token, json_record=False), token
    assert check_records.contains(numbers, "30.3", json_record=True)  # JSON fractions shown as percentages


def test_the_readme_demo_table_is_checked_against_the_demo_seeds_record(tmp_path):
    root = _repo(tmp_path, GOOD_ROW, GOOD_RECORD + "SigLIP - SS: +2.1, sd 0.40\n")
    readme = "# x\n\n| test split, min – max over seeds 0–4 | CE | SS |\n|---|---:|---:|\n"
    readme += "| PR-AUC | 3.2 – 34.2 % | 4.3 % |\n"
    (root / "README.md").write_text(readme)
    assert check_records.readme_demo_problems(root) == [
        "README.md: its demo table needs the record benchmarks/results/demo_seeds.md, which does not exist"
    ]
    (root / "benchmarks" / "results" / "demo_seeds.md").write_text("Date 2026-11-25. | 3.2 – 34.2 | 4.4 – 16.2 |\n")
    assert check_records.readme_demo_problems(root) == [
        "README.md:5: demo figure '4.3' is not in benchmarks/results/demo_seeds.md"
    ]
    (root / "README.md").write_text(readme.replace("4.3 %", "4.4 %") + DECISION)
    assert check_records.check(root) == []


DECISION = (
    "\n### Which objective, when\n\n| situation | use | effect (spread) | why |\n|---|---|---|---|\n"
    "| frozen towers, 3 draws | SigLIP | PR-AUC +2.1 (sd 0.4 between draws) | [suite](benchmarks/results/r.md) |\n"
)


def test_the_readme_decision_table_is_checked_against_its_records(tmp_path):
    root = _repo(tmp_path, GOOD_ROW, GOOD_RECORD + "SigLIP - SS: +2.1, sd 0.40\n")
    (root / "README.md").write_text("# x\n")
    assert check_records.readme_decision_problems(root) == [
        "README.md: no '### Which objective, when' section (the decision table of issue #30)"
    ]
    (root / "README.md").write_text(DECISION)
    assert check_records.readme_decision_problems(root) == []
    (root / "README.md").write_text(DECISION.replace("+2.1", "+2.2"))
    assert check_records.readme_decision_problems(root) == [
        "README.md:6: decision figure '2.2' is in none of its records ['benchmarks/results/r.md']"
    ]
    (root / "README.md").write_text(DECISION.replace("r.md", "gone.md"))
    assert "which do not exist" in check_records.readme_decision_problems(root)[0]
    (root / "README.md").write_text(DECISION.replace("[suite](benchmarks/results/r.md)", "suite"))
    assert "links no record" in check_records.readme_decision_problems(root)[0]
