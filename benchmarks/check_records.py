"""Every figure of BENCHMARKS.md's summary against the record it comes from.

    python -m benchmarks.check_records [--root .]

Reads the ``## Summary`` table of ``BENCHMARKS.md`` and reports (exit status 1) where

* a row links no record under ``benchmarks/results/`` (a row whose command cell starts with "same" shares the
  record of the row above; a row marked ``history`` with its date, e.g. "history (measured 2026-11-22, no
  record)", is a figure kept for the record of what was once measured and needs none);
* a Markdown record of the row states no date (YYYY-MM-DD), names no machine (its cores or CPU) or says nothing
  of the machine's load (the word "load": what else ran beside the measurement, or that the run did not record it);
* a number of the row's result cell is in none of its records. A record number matches a figure when it rounds to
  it at the precision shown ("+5.18" matches 5.184, "1.7e-5" matches 1.72e-05, "10,228" matches 10228); fractions
  stored in JSON match the percentages shown (0.303 for 30.3);
* a number of README.md's demo table (the one headed "... over seeds ...") is not in the demo_seeds record;
* README.md's decision table ("### Which objective, when") is missing, a row links no existing record, or a
  number of its effect cell is in none of the row's records;
* a relative link of BENCHMARKS.md or of a Markdown record points to no file (or to no heading of BENCHMARKS.md);
* a record names a module or script (``ce_retrieval/...py``, ``benchmarks/...py``, ``ce_retrieval.a.b``) that does
  not exist.

The test suite runs it on the repository and on broken fixtures (tests/benchmarks/test_check_records.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys

from benchmarks import ROOT

RESULTS = "benchmarks/results/"
DEMO_RECORD = "benchmarks/results/demo_seeds.md"
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-−+]?\d+)?)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DATE = re.compile(r"\b20\d{2}-\d{2}-\d{2}(?!\d)")
HISTORY = re.compile(r"(?=.*\bhistory\b)(?=.*\b\d{4}-\d{2}-\d{2}\b)", re.IGNORECASE)
MODULE_PATH = re.compile(r"\b((?:ce_retrieval|benchmarks|tests|scripts)/[\w/.\-]*\.(?:py|sh|yaml))\b")
MODULE_DOTTED = re.compile(r"(?<![\w./])((?:ce_retrieval|benchmarks)(?:\.[A-Za-z_]\w*)+)")


@dataclasses.dataclass
class Row:
    """One summary row: its cells, the records it links and whether it is kept as history."""

    line: int
    figure: str
    result: str
    command: str
    records: list[str]
    history: bool


def summary_rows(text: str) -> list[Row]:
    """The rows of the first table under ``## Summary`` (header and rule lines excluded)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Summary"), None)
    if start is None:
        raise ValueError("BENCHMARKS.md has no '## Summary' section")
    rows, previous, seen_table = [], [], False
    for i in range(start + 1, len(lines)):
        line = lines[i].strip()
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if seen_table:
                break
            continue
        seen_table = True
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 5 or cells[0] in ("figure (issue)",) or set(cells[0]) <= set("-: "):
            continue
        command = cells[4]
        records = [t for t in LINK.findall(line) if t.startswith(RESULTS)]
        if not records and command.lower().startswith("same"):
            records = previous
        previous = records
        rows.append(Row(i + 1, cells[0], cells[2], command, records, bool(HISTORY.search(command))))
    return rows


def _value(token: str) -> float:
    return float(token.replace(",", "").replace("−", "-"))


def figures(cell: str) -> list[str]:
    """The numbers written in a result cell (link targets dropped)."""
    return NUMBER.findall(LINK.sub(lambda m: m.group(0).split("](")[0], cell))


def _tolerance(token: str) -> float:
    """Half a unit of the last digit shown: the figure is the record's number rounded as written."""
    mantissa, _, exponent = token.replace(",", "").replace("−", "-").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def record_numbers(text: str) -> list[float]:
    return [_value(t) for t in NUMBER.findall(text)]


def contains(numbers: list[float], token: str, json_record: bool) -> bool:
    """Whether some record number rounds to ``token`` (or, in a JSON record, to ``token`` / 100)."""
    value, tol = _value(token), _tolerance(token) * (1 + 1e-9)
    candidates = [(value, tol), (value / 100, tol / 100)] if json_record else [(value, tol)]
    return any(abs(n - v) <= t for v, t in candidates for n in numbers)


def _undated(name: str, text: str) -> bool:
    """A Markdown record must say when its figures were measured (JSON records travel with their Markdown)."""
    return name.endswith(".md") and not DATE.search(text)


def _no_load(name: str, text: str) -> bool:
    """A Markdown record must say what load the machine carried (figures on 2 shared cores depend on it)."""
    return name.endswith(".md") and not re.search(r"\bload", text, re.IGNORECASE)


def _no_machine(name: str, text: str) -> bool:
    """A Markdown record must name the machine it ran on (at least its cores or its CPU)."""
    return name.endswith(".md") and not re.search(r"\b(cores?|CPUs?)\b", text, re.IGNORECASE)


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _check_links(path: pathlib.Path, root: pathlib.Path, anchors: set[str]) -> list[str]:
    problems = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        if not file:
            if path.name == "BENCHMARKS.md" and anchor not in anchors:
                problems.append(f"{path.relative_to(root)}: link to '#{anchor}', a heading that does not exist")
            continue
        base = root if path.name == "BENCHMARKS.md" else path.parent
        if not (base / file).exists():
            problems.append(f"{path.relative_to(root)}: link to '{target}', a file that does not exist")
    return problems


def _check_modules(path: pathlib.Path, root: pathlib.Path) -> list[str]:
    text, problems = path.read_text(), []
    for name in sorted(set(MODULE_PATH.findall(text))):
        if not (root / name).exists():
            problems.append(f"{path.relative_to(root)}: names '{name}', which does not exist")
    for dotted in sorted(set(MODULE_DOTTED.findall(text))):
        parts = dotted.split(".")
        # ce_retrieval.a.b.Name (or benchmarks.a.b): the longest prefix that is a package or module must cover all
        # but one trailing attribute (a class or function of that module), and at least the sub-package after the root
        found = 0
        for k in range(len(parts), 0, -1):
            p = root.joinpath(*parts[:k])
            if p.with_suffix(".py").exists() or (p / "__init__.py").exists():
                found = k
                break
        if found < max(2, len(parts) - 1):
            problems.append(f"{path.relative_to(root)}: names '{dotted}', which does not exist")
    return problems


def readme_demo_problems(root: pathlib.Path) -> list[str]:
    """README's demo table (the one headed "min – max over seeds") against the demo_seeds record it comes from."""
    readme, record = root / "README.md", root / DEMO_RECORD
    if not readme.exists():
        return []
    lines = readme.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|") and "over seeds" in line), None)
    if start is None:
        return ["README.md: no demo table headed '... over seeds ...' (the demo's figures as a range over seeds)"]
    if not record.exists():
        return [f"README.md: its demo table needs the record {DEMO_RECORD}, which does not exist"]
    numbers, problems = record_numbers(record.read_text()), []
    for i in range(start + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        for cell in lines[i].strip("|").split("|")[1:]:
            problems += [
                f"README.md:{i + 1}: demo figure {t!r} is not in {DEMO_RECORD}"
                for t in figures(cell)
                if not contains(numbers, t, json_record=False)
            ]
    return problems


DECISION_HEADING = "### Which objective, when"


def readme_decision_problems(root: pathlib.Path) -> list[str]:
    """README's decision table (the first table under "### Which objective, when": situation | objective | effect
    and spread | ...): every row links at least one record under ``benchmarks/results/`` that exists, and every
    number of its third cell (the effect and its spread) is in one of the row's records."""
    readme = root / "README.md"
    if not readme.exists():
        return []
    lines = readme.read_text().splitlines()
    head = next((i for i, line in enumerate(lines) if line.strip() == DECISION_HEADING), None)
    if head is None:
        return [f"README.md: no '{DECISION_HEADING}' section (the decision table of issue #30)"]
    start = next((i for i in range(head + 1, len(lines)) if lines[i].startswith("|")), None)
    if start is None:
        return [f"README.md:{head + 1}: '{DECISION_HEADING}' has no table"]
    problems = []
    for i in range(start + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = lines[i].strip().strip("|").split("|")
        links = [link for link in LINK.findall(lines[i]) if link.startswith(RESULTS)]
        if not links:
            problems.append(f"README.md:{i + 1}: decision row links no record under {RESULTS}")
            continue
        missing = [link for link in links if not (root / link.split("#")[0]).is_file()]
        if missing:
            problems.append(f"README.md:{i + 1}: decision row links {missing}, which do not exist")
            continue
        numbers = {r: record_numbers((root / r.split("#")[0]).read_text()) for r in links}
        effect = cells[2] if len(cells) > 2 else ""
        for token in figures(effect):
            if not any(contains(numbers[r], token, r.split("#")[0].endswith(".json")) for r in links):
                problems.append(f"README.md:{i + 1}: decision figure {token!r} is in none of its records {links}")
    return problems


def check(root: pathlib.Path) -> list[str]:
    """Every problem found, one line each (empty when BENCHMARKS.md and its records agree)."""
    root = pathlib.Path(root)
    bench = root / "BENCHMARKS.md"
    text = bench.read_text()
    anchors = {_slug(m) for m in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}
    problems = []
    for row in summary_rows(text):
        where = f"BENCHMARKS.md:{row.line} ({row.figure[:60]})"
        if row.history:
            continue
        if not row.records:
            problems.append(f"{where}: links no record under {RESULTS} and is not marked as history with a date")
            continue
        missing = [r for r in row.records if not (root / r).is_file()]
        if missing:
            problems.append(f"{where}: linked record {missing} does not exist")
            continue
        texts = {r: (root / r).read_text() for r in row.records}
        problems += [f"{where}: record {r} states no date (YYYY-MM-DD)" for r, t in texts.items() if _undated(r, t)]
        problems += [f"{where}: record {r} says nothing of the load" for r, t in texts.items() if _no_load(r, t)]
        problems += [f"{where}: record {r} names no machine" for r, t in texts.items() if _no_machine(r, t)]
        numbers = {r: record_numbers(t) for r, t in texts.items()}
        for token in figures(row.result):
            if not any(contains(numbers[r], token, r.endswith(".json")) for r in row.records):
                problems.append(f"{where}: figure {token!r} is in none of its records {row.records}")
    records = sorted((root / RESULTS).rglob("*.md"))
    for path in [bench, *records]:
        problems += _check_links(path, root, anchors)
    for path in records:
        problems += _check_modules(path, root)
    return problems + readme_demo_problems(root) + readme_decision_problems(root)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT))
    args = parser.parse_args(argv)
    problems = check(pathlib.Path(args.root))
    for p in problems:
        print(p)
    print(f"check_records: {len(problems)} problem(s)" if problems else "check_records: every summary figure found")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
