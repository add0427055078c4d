"""README's "Who may do what" table is the authority module's, row for row."""

from __future__ import annotations

from pathlib import Path

from incidents.teams.authority import matrix_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def table_rows(text: str, after: str) -> list[str]:
    lines = text[text.index(after) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| action | alert level"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_shows_the_generated_matrix():
    readme = table_rows(README.read_text(), "## Who may do what")
    generated = table_rows(matrix_markdown(), "# Authority matrix")
    assert readme == generated
    assert len(readme) > 20
