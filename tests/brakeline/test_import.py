"""Importing the SDK must stay cheap and free of server and heavy optional dependencies."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _modules_after(statement: str) -> set[str]:
    code = (
        f"import sys\n{statement}\n"
        "print('\\n'.join(sorted({name.split('.')[0] for name in sys.modules})))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(completed.stdout.split())


def test_import_brakeline_pulls_in_no_django_and_no_optional_frameworks():
    modules = _modules_after("import brakeline, brakeline.integrations")
    assert "brakeline" in modules
    assert "django" not in modules
    for optional in ("torch", "numpy", "websockets", "lightning", "transformers"):
        assert optional not in modules, f"{optional} imported eagerly"


def test_no_module_of_the_sdk_mentions_django():
    for source in (REPO / "sdk" / "brakeline").rglob("*.py"):
        text = source.read_text()
        assert "import django" not in text and "from django" not in text, source
