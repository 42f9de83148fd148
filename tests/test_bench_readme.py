"""``python -m bench.readme``: the README's benchmark table is one full run, put there whole."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module(tmp_path: Path, readme_text: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_readme_under_test", ROOT / "bench" / "readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.README = tmp_path / "README.md"
    module.PUBLISHED = tmp_path / "published.json"
    module.README.write_text(readme_text)
    return module


def _results(tmp_path: Path, *, quick: bool = False) -> Path:
    data: dict[str, Any] = {
        "environment": {"python": "3.12.1", "implementation": "CPython", "cpu": "Test CPU", "cores": 2,
                        "platform": "Linux", "time": "2026-11-24T17:14:37Z",
                        "packages": {"pluggy": "1.7.0", "mcp": None}},
        "quick": quick,
        "rows": [
            {"case": "core | overhead", "ours": 20.734, "reference": None, "unit": "µs/call", "ratio": None,
             "target": "≤ 40 µs", "met": True},
            {"case": "audit added", "ours": 71.22, "reference": 22.56, "unit": "µs/call", "ratio": 4.157,
             "target": "≤ 10 µs", "met": False},
            {"case": "throughput", "ours": 12469.2, "reference": None, "unit": "calls/s", "ratio": None,
             "target": "", "met": None},
        ],
    }
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(data))
    return path


TEXT = "# Project\n\nintro\n\n<!-- bench-table:start -->\nold table\n<!-- bench-table:end -->\n\nafter\n"


def test_the_table_is_every_row_of_the_run_between_the_markers_and_nothing_else_changes(tmp_path: Path) -> None:
    module = _module(tmp_path, TEXT)
    results = _results(tmp_path)
    assert module.main([str(results)]) == 0
    text = module.README.read_text()
    assert text.startswith("# Project\n\nintro\n\n<!-- bench-table:start -->\n")
    assert text.endswith("<!-- bench-table:end -->\n\nafter\n")
    assert "old table" not in text
    assert "Full run of 2026-11-24T17:14:37Z" in text and "CPython 3.12.1, Test CPU, 2 cores" in text
    assert "pluggy 1.7.0" in text and "mcp" not in text.split("\n\n| case")[0].split("pluggy")[1]
    assert "| core \\| overhead | 20.7 | — | µs/call | — | ≤ 40 µs | yes |" in text
    assert "| audit added | 71.2 | 22.6 | µs/call | 4.16 | ≤ 10 µs | **no** |" in text
    assert "| throughput | 12,469 | — | calls/s | — | — | — |" in text
    assert json.loads(module.PUBLISHED.read_text()) == json.loads(results.read_text())


def test_a_quick_run_is_refused_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = _module(tmp_path, TEXT)
    assert module.main([str(_results(tmp_path, quick=True))]) == 2
    assert module.README.read_text() == TEXT and not module.PUBLISHED.exists()
    assert "--quick" in capsys.readouterr().err


def test_a_readme_without_the_markers_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = _module(tmp_path, "# Project\n")
    assert module.main([str(_results(tmp_path))]) == 2
    assert module.README.read_text() == "# Project\n" and not module.PUBLISHED.exists()
    assert "bench-table:start" in capsys.readouterr().err


def test_the_published_run_is_the_one_in_the_readme() -> None:
    """The repository's README table and bench/published.json come from the same run."""
    spec = importlib.util.spec_from_file_location("bench_readme_check", ROOT / "bench" / "readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    published = json.loads((ROOT / "bench" / "published.json").read_text())
    assert not published["quick"]
    assert module.table(published) in (ROOT / "README.md").read_text()
