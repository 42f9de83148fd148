"""The framework adapters' tests are run, not skipped: the default envs do not collect
tests/integrations (they lack the frameworks), ``tox -e integrations`` does, with the extras, and
the core never imports a framework."""

from __future__ import annotations

import configparser
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent


def _core_conftest() -> object:
    """tests/conftest.py by its path (``import conftest`` may find tests/integrations' one)."""
    spec = importlib.util.spec_from_file_location("core_conftest", ROOT / "tests" / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFTEST = _core_conftest()
INTEGRATIONS: Path = CONFTEST.INTEGRATIONS  # type: ignore[attr-defined]
pytest_ignore_collect = CONFTEST.pytest_ignore_collect  # type: ignore[attr-defined]
EXTRAS = ("openai-agents", "pydantic-ai", "langchain")


def _ini(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / name)
    return parser


def test_the_integrations_env_is_in_the_default_tox_run_and_runs_the_directory_with_the_extras() -> None:
    tox = _ini("tox.ini")
    assert "integrations" in [e.strip() for e in tox["tox"]["env_list"].split(",")]
    env = tox["testenv:integrations"]
    assert "tests/integrations" in env["commands"]
    assert set(EXTRAS) <= set(env["extras"].split())


def test_each_framework_is_an_extra_with_a_bounded_range() -> None:
    extras = _ini("setup.cfg")["options.extras_require"]
    for extra in EXTRAS:
        requirements = [line for line in extras[extra].splitlines() if line.strip()]
        assert requirements and all(">=" in r and "<" in r.split(">=", 1)[1] for r in requirements), requirements


def test_the_default_run_leaves_the_directory_out_and_a_run_naming_it_collects_it() -> None:
    def config(*args: str) -> SimpleNamespace:
        return SimpleNamespace(args=list(args), invocation_params=SimpleNamespace(dir=ROOT))

    assert pytest_ignore_collect(INTEGRATIONS, config("tests")) is True  # type: ignore[arg-type]
    assert pytest_ignore_collect(INTEGRATIONS, config("tests/integrations")) is None  # type: ignore[arg-type]
    assert pytest_ignore_collect(  # type: ignore[arg-type]
        INTEGRATIONS, config("tests/integrations/test_integration_docs.py::test_each_framework_has_an_example")) is None
    assert pytest_ignore_collect(ROOT / "tests" / "other", config("tests")) is None  # type: ignore[arg-type]


def test_integrations_md_examples_are_left_to_the_integrations_env() -> None:
    from test_docs_snippets import DOCS

    assert ROOT / "docs" / "integrations.md" not in DOCS
    assert "docs\" / \"integrations.md" in (INTEGRATIONS / "test_integration_docs.py").read_text()


def test_the_core_imports_no_framework() -> None:
    code = ("import sys, pkgutil, importlib, amplifier_tools\n"
            "FRAMEWORKS = {'agents', 'pydantic_ai', 'langchain_core', 'langchain', 'langgraph'}\n"
            "for m in pkgutil.walk_packages(amplifier_tools.__path__, 'amplifier_tools.'):\n"
            "    if m.name.endswith('__main__'): continue\n"
            "    if not m.name.startswith('amplifier_tools.integrations.') or m.name.endswith('._common'):\n"
            "        try: importlib.import_module(m.name)\n"
            "        except ImportError as exc:\n"
            "            if (exc.name or '').split('.')[0] in FRAMEWORKS: raise\n"
            "print(sorted(FRAMEWORKS & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_pydantic_ai_extra_installs_only_where_pydantic_ai_does() -> None:
    """Found by a new-user trial: on Python 3.10, ``pip install 'amplifier-tools[pydantic-ai]'``
    failed (every Pydantic AI release of the range needs 3.11), and the adapter's ``ImportError``
    repeated that install command."""
    from packaging.requirements import Requirement
    from setuptools.config.setupcfg import read_configuration

    # As setuptools reads it (a marker on the line of ``extra = requirement`` is split off at ``;``).
    [line] = read_configuration(ROOT / "setup.cfg")["options"]["extras_require"]["pydantic_ai"]
    requirement = Requirement(line)
    assert requirement.marker is not None
    assert not requirement.marker.evaluate({"python_version": "3.10"})
    assert requirement.marker.evaluate({"python_version": "3.11"})


def test_the_pydantic_ai_adapter_on_python_3_10_says_it_needs_3_11() -> None:
    script = (
        "import sys; sys.modules['pydantic_ai'] = None\n"  # as where the extra installed nothing
        "sys.version_info = (3, 10, 13, 'final', 0)\n"
        "try:\n"
        "    import amplifier_tools.integrations.pydantic_ai\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "needs Python 3.11 or later" in done.stdout, done.stdout + done.stderr
    assert "pip install" not in done.stdout
