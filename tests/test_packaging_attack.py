"""A new user who installs the core only (no extras) and writes a configuration that asks for what an
extra provides: the command line stops with the extra's install command, in the error and in the
hint line, never a traceback and never a hint to change a setting that is right (found by a new-user
trial of the built wheel in a fresh venv: MCP servers configured without the ``mcp`` extra were met
with "hint: set plugins.mcp.servers in the configuration", a YAML file without PyYAML with "hint: fix
the configuration").

The fast tests hide the extras' modules from the subprocess (``sys.modules[name] = None``); the slow
one installs the built wheel, without extras, into a fresh virtual environment (it needs PyPI for the
core's dependencies)."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from cli_helpers import cli_environ

ROOT = Path(__file__).resolve().parent.parent

#: The modules each extra brings, hidden from the subprocess as if the extra were not installed.
HIDDEN = ("mcp", "yaml", "redis", "opentelemetry", "orjson")
#: Runs the command line with the extras' modules unimportable.
WITHOUT_EXTRAS = ("import sys\n"
                  f"sys.modules.update(dict.fromkeys({HIDDEN!r}))\n"
                  "from amplifier_tools.cli import main\n"
                  "raise SystemExit(main(sys.argv[1:]))\n")

MCP_SERVER = '[plugins.mcp.servers.echo]\ncommand = "echo-mcp-server"\n'
#: (config file name, its text, the command, the extra it needs)
CASES = [
    ("amplifier-tools.toml", MCP_SERVER, ["list"], "mcp"),
    ("amplifier-tools.toml", MCP_SERVER, ["call", "local::fs.list_dir", "{}"], "mcp"),
    ("amplifier-tools.toml", MCP_SERVER, ["mcp", "pin"], "mcp"),
    ("amplifier-tools.toml", '[plugins.mcp.serve]\ntools = ["*"]\n', ["serve-mcp"], "mcp"),
    ("amplifier-tools.toml", '[plugins.policy]\nstore = "redis://127.0.0.1:1/0"\n', ["policy", "status"], "redis"),
    ("plan.yaml", "context:\n  principal: agent-1\n", ["--config", "plan.yaml", "list"], "yaml"),
    ("amplifier-tools.toml", '[plugins.policy]\nstore = "redis://127.0.0.1:1/0"\n', ["list"], "redis"),
    ("amplifier-tools.toml", "[plugins.audit]\notel = true\n", ["list"], "otel"),
]


def _workspace(tmp_path: Path, name: str, text: str) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "work"
    work.mkdir()
    (work / name).write_text(text)
    return work, {"XDG_STATE_HOME": str(tmp_path / "state")}


def _assert_names_the_extra(done: subprocess.CompletedProcess[str], extra: str) -> None:
    install = f"pip install 'amplifier-tools[{extra}]'"
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    hint = [line for line in done.stderr.splitlines() if line.startswith("hint:")]
    assert error and install in error[0], done.stderr
    assert hint and hint[0].startswith(f"hint: {install}"), done.stderr


@pytest.mark.parametrize(("name", "text", "command", "extra"), CASES,
                         ids=[f"{extra}-{' '.join(command)}" for _, _, command, extra in CASES])
def test_a_setting_that_needs_a_missing_extra_names_its_install_in_error_and_hint(
        tmp_path: Path, name: str, text: str, command: list[str], extra: str) -> None:
    work, env = _workspace(tmp_path, name, text)
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, *command], cwd=work,
                          env=cli_environ(work, env=env), capture_output=True, text=True, timeout=120)
    _assert_names_the_extra(done, extra)


def test_the_core_alone_calls_verifies_and_lists_plugins(tmp_path: Path) -> None:
    """The quick start without any extra: no extra's module is needed by a call, ``plugins`` or
    ``audit verify`` (orjson, the ``fast`` extra, is optional: the stdlib encoder stands in)."""
    work, env = _workspace(tmp_path, "README.md", "# title\nbody\n")
    for command, expected in ((["call", "local::fs.read_file", '{"path": "README.md", "limit": 1}'], "# title"),
                              (["plugins"], "mcp"), (["audit", "verify"], "OK: 1 records")):
        done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, *command], cwd=work,
                              env=cli_environ(work, env=env), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and expected in done.stdout, (command, done.stdout, done.stderr)


#: The tests that install from PyPI into a fresh venv (minutes, and the network) run only when asked.
from_pypi = pytest.mark.skipif(os.environ.get("AMPLIFIER_TOOLS_TEST_PYPI") != "1",
                               reason="installs from PyPI into a fresh venv: set AMPLIFIER_TOOLS_TEST_PYPI=1")


@pytest.mark.slow
@from_pypi
def test_the_built_wheel_without_extras_in_a_fresh_venv(tmp_path: Path) -> None:
    """The wheel as a new user installs it (``pip install amplifier-tools``, no extras): the console
    script runs the quick start, and each setting that needs an extra names the extra."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(".git", ".tox", "*.egg-info", "build", "dist",
                                                                   "__pycache__", ".venv", "results"))
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--wheel",
                            "--outdir", str(dist), str(checkout)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = dist.glob("*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("AMPLIFIER_TOOLS_", "VIRTUAL_ENV", "PYTHON"))}
    installed = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], env=environ,
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    for name, text, command, extra in CASES:
        case = tmp_path / f"case-{extra}-{command[0]}"
        case.mkdir()
        work, env = _workspace(case, name, text)
        done = subprocess.run([str(bin_dir / "amplifier-tools"), *command], cwd=work, env={**environ, **env},
                              capture_output=True, text=True, timeout=120)
        _assert_names_the_extra(done, extra)
    quick = tmp_path / "quick"
    quick.mkdir()
    work, env = _workspace(quick, "README.md", "# title\n")
    done = subprocess.run([str(bin_dir / "amplifier-tools"), "call", "local::fs.read_file", '{"path": "README.md"}'],
                          cwd=work, env={**environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "# title" in done.stdout, done.stderr
    adapter = subprocess.run([str(bin_dir / "python"), "-c", "import amplifier_tools.integrations.langchain"],
                             env=environ, capture_output=True, text=True, timeout=120)
    assert "pip install 'amplifier-tools[langchain]'" in adapter.stderr.splitlines()[-1], adapter.stderr


def _extra_floor(extra: str, distribution: str) -> str:
    """The lower bound setup.cfg states for ``distribution`` in ``extra``."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "setup.cfg")
    for requirement in parser["options.extras_require"][extra].split("\n"):
        name, _, rest = requirement.strip().partition(">=")
        if name == distribution:
            return rest.split(",")[0].split(";")[0].strip()
    raise AssertionError(f"{distribution} is not in the {extra} extra")


@pytest.mark.slow
@from_pypi
def test_the_mcp_extras_floor_takes_what_the_client_passes(tmp_path: Path) -> None:
    """Found by installing the floor: with ``mcp>=2`` pip may pick 2.0.0, whose
    ``streamable_http_client`` has no ``max_sse_event_size`` (2.3 added it), and every HTTP server
    failed to start with "TypeError: streamable_http_client() got an unexpected keyword argument"."""
    floor = _extra_floor("mcp", "mcp")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    installed = subprocess.run([python, "-m", "pip", "install", "-q", f"mcp=={floor}"], env=environ,
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    check = ("import inspect\nfrom mcp.client.streamable_http import streamable_http_client\n"
             "print('max_sse_event_size' in inspect.signature(streamable_http_client).parameters)\n")
    done = subprocess.run([python, "-c", check], env=environ, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", (floor, done.stdout, done.stderr)


@pytest.mark.parametrize("module", [f"amplifier_tools.mcp.{name}" for name in ("server", "http", "client")])
def test_importing_the_mcp_modules_without_the_extra_names_it(module: str) -> None:
    """Found by a newcomer's trial: serving from Python without the ``mcp`` extra
    (``from amplifier_tools.mcp.server import serve``) failed with "No module named 'anyio'", naming
    no extra; the adapters' modules name theirs (``errors.missing_extra``), and these now do too."""
    code = f"import sys\nsys.modules.update(dict.fromkeys({HIDDEN!r}))\nimport {module}\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"ImportError: {module} needs the 'mcp' extra (mcp"), done.stderr
    assert last.endswith("is not installed): pip install 'amplifier-tools[mcp]'"), done.stderr
