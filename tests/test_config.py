"""Host configuration: validation, overrides, files and environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import ConfigError, ToolHost
from amplifier_tools.config import CONFIG_SCHEMA, load_config_file
from amplifier_tools.schema_fastpath import compile_check


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"plugns": {}}, "plugns: is not an allowed property"),
        ({"default_timeout_ms": -5}, "default_timeout_ms: -5 is less than or equal"),
        ({"plugins": {"x": {"on_error": "explode"}}}, "plugins.x.on_error"),
        ({"context": {"scopes": "admin"}}, "context.scopes"),
        ([1, 2], "must be a table/mapping"),
    ],
)
def test_invalid_config_names_the_key(config: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        ToolHost(config=config)
    assert fragment in str(info.value)


@pytest.mark.parametrize("config", [
    {}, {"tools": {"x": {"policies": {}}}}, {"tools": [{"module": "m"}]}, {"tools": "x"}, {"tools": [{"config": {}}]},
    {"tools": [{"module": "m"}], "modules": [{"module": "n", "config": {"a": 1}}]}, {"context": {"principal": "me"}},
    {"plugins": {"p": {"on_error": "x"}}}, {"default_timeout_ms": 0}, {"secrets": {"K": "ENV_K"}},
])
def test_the_configuration_schema_compiles_to_the_fast_path_that_agrees_with_jsonschema(config: Any) -> None:
    """Start-up: a valid configuration is checked without jsonschema (imported only to name what is wrong)."""
    check = compile_check(CONFIG_SCHEMA)
    assert check is not None
    assert check(config) == jsonschema.Draft202012Validator(CONFIG_SCHEMA).is_valid(config)


async def test_tool_overrides_change_policies(host_factory: Any, echo: EchoTool) -> None:
    host = await host_factory(ToolsPlugin(echo), config={"tools": {"echo": {"policies": {"timeout_ms": 1234}}}})
    assert host.specs[0].policies.timeout_ms == 1234


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"policies": {"timeout_ms": -1}}, "tools.echo"),
        ({"polices": {}}, "tools.echo.polices: unknown key 'polices'"),
        ({"policies": {"retry": {"max_attempts": 0}}}, "max_attempts must be positive"),
    ],
)
async def test_invalid_tool_override_fails_start_naming_the_key(
    host_factory: Any, echo: EchoTool, override: dict[str, Any], fragment: str
) -> None:
    from amplifier_tools import PluginLoadError

    with pytest.raises((ConfigError, PluginLoadError)) as info:
        await host_factory(ToolsPlugin(echo), config={"tools": {"echo": override}})
    assert fragment in str(info.value)


async def test_override_for_unmounted_tool_is_an_error(host_factory: Any, echo: EchoTool) -> None:
    with pytest.raises(ConfigError, match=r"tools\.ehco: names no mounted tool"):
        await host_factory(ToolsPlugin(echo), config={"tools": {"ehco": {"policies": {"timeout_ms": 5}}}})


async def test_section_for_unknown_plugin_is_an_error(host_factory: Any) -> None:
    with pytest.raises(ConfigError, match=r"plugins\.nosuch: names no installed plugin"):
        await host_factory(config={"plugins": {"nosuch": {}}})


def test_toml_file_with_env_substitution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ROLE", "reviewer")
    path = tmp_path / "amplifier-tools.toml"
    path.write_text('[context]\nprincipal = "bot"\nrole = "${AGENT_ROLE}"\n')
    assert load_config_file(path) == {"context": {"principal": "bot", "role": "reviewer"}}
    path.write_text('[context]\nrole = "${NOT_SET_ANYWHERE}"\n')
    with pytest.raises(ConfigError, match=r"amplifier-tools.toml: context.role: environment variable"):
        load_config_file(path)


def test_pyproject_section_and_bad_toml(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n[tool.amplifier-tools]\ndefault_timeout_ms = 500\n')
    assert load_config_file(pyproject) == {"default_timeout_ms": 500}
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load_config_file(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("hook_timeout_ms = 'soon'\n")
    with pytest.raises(ConfigError, match=r"wrong.toml: hook_timeout_ms: .*'soon' is not of type 'number'"):
        load_config_file(wrong)



@pytest.mark.parametrize("spelling", ["amplifier_tools", "Amplifier-Tools", "amplifier.tools"])
def test_a_misspelled_pyproject_section_stops_the_start_naming_the_right_one(tmp_path: Path, spelling: str) -> None:
    """Found by a new-user trial: ``[tool.amplifier_tools]``, rules and all, was ignored without a
    word (discovery found no section, ``trust`` said no configuration file) and the host ran on
    its defaults."""
    from amplifier_tools.config import discover_config_file

    pyproject = tmp_path / "pyproject.toml"
    table = f'"{spelling}"' if "." in spelling else spelling
    pyproject.write_text(f'[project]\nname = "x"\n[tool.{table}]\ndefault_timeout_ms = 500\n')
    for load in (lambda: discover_config_file(tmp_path), lambda: load_config_file(pyproject)):
        with pytest.raises(ConfigError, match=r"is not read: this host's section is \[tool.amplifier-tools\]") as info:
            load()
        assert info.value.hint is not None and "[tool.amplifier-tools]" in info.value.hint
    pyproject.write_text('[project]\nname = "x"\n[tool.ruff]\nline-length = 100\n')  # another tool's: not ours
    assert discover_config_file(tmp_path) is None


def test_an_amplifier_mount_plans_agent_sections_and_sources_are_named_not_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a new-user trial: a real mount plan failed with "'session' is not an allowed
    property", and a module's ``source`` (a git URL at another version) was accepted and ignored
    without a word, the installed version mounted instead."""
    pytest.importorskip("yaml")
    plan = tmp_path / "plan.yaml"
    plan.write_text("session:\n  orchestrator: loop-basic\nproviders:\n  - module: provider-x\ntools:\n"
                    "  - module: tool-filesystem\n    source: git+https://example.invalid/x@v9.9.9\n")
    with caplog.at_level("WARNING", logger="amplifier_tools.config"):
        assert load_config_file(plan) == {
            "modules": [{"module": "tool-filesystem", "source": "git+https://example.invalid/x@v9.9.9"}]}
    text = caplog.text
    assert "'session', 'providers' configure the agent, not its tools" in text and str(plan) in text
    assert "source 'git+https://example.invalid/x@v9.9.9' is not installed by amplifier-tools" in text


@pytest.mark.parametrize(("plan", "key", "hint"), [
    ({"tools": [{"modul": "tool-bash"}]}, "tools.0.modul", "did you mean 'module'?"),
    ({"hooks": [{"module": "h"}, {"modul": "x"}]}, "hooks.1.modul", "did you mean 'module'?"),
    ({"tools": [{"module": "a", "confg": {}}]}, "tools.0.confg", "did you mean 'config'?"),
])
def test_a_mount_plan_typo_names_the_key_and_the_right_one(plan: dict[str, Any], key: str, hint: str) -> None:
    """Found by a new-user trial: ``modul:`` in a mount plan's ``tools`` said only "is not valid under
    any of the given schemas" (the table-or-list union), naming neither the key nor the fix."""
    from amplifier_tools.config import validate_config

    with pytest.raises(ConfigError) as info:
        validate_config(plan, file="plan.yaml")
    assert info.value.key == key and "is not an allowed property" in str(info.value) and info.value.hint == hint

def test_mount_plan_yaml_is_accepted(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    plan = tmp_path / "plan.yaml"
    plan.write_text("tools:\n  - module: my_tool\n    config:\n      max_size: 10\nhooks:\n  - module: my_hook\n")
    assert load_config_file(plan) == {
        "modules": [{"module": "my_tool", "config": {"max_size": 10}}, {"module": "my_hook"}]
    }


async def test_default_context_comes_from_config(host_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN_VAR", "tok-123456")
    host = await host_factory(config={"context": {"principal": "ci-bot", "scopes": ["fs:read"]},
                                      "secrets": {"TOKEN": "MY_TOKEN_VAR"}})
    ctx = host.default_context
    assert ctx.principal == "ci-bot" and ctx.scopes == frozenset({"fs:read"})
    assert ctx.secret("TOKEN") == "tok-123456"


async def test_a_section_for_no_installed_plugin_names_the_file_and_the_likely_plugin(tmp_path: Path) -> None:
    config = tmp_path / "amplifier-tools.toml"
    config.write_text("[plugins.filesytem]\nmax_results = 5\n")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ConfigError) as caught:
        await ToolHost(config=config, working_dir=work, entry_points=False).start()
    assert str(caught.value).startswith(f"{config}: plugins.filesytem: names no installed plugin")
    assert caught.value.hint == "did you mean 'filesystem'?"


@pytest.mark.parametrize("verbose", [False, True])
def test_a_substituted_value_quoted_by_a_start_error_is_redacted(tmp_path: Path, verbose: bool) -> None:
    """Found in review: ``${VAR}`` values are secrets, yet a setting's error quoted what it got
    (``denied_paths = "${TOKEN}"`` printed the token, and ``-v``'s traceback again)."""
    from cli_helpers import cli

    secret = "s3cr3t-value-0123456789abcdef"
    (tmp_path / "cfg.toml").write_text('[plugins.filesystem]\ndenied_paths = "${TEST_SUBSTITUTED_TOKEN}"\n')
    done = cli(tmp_path, "--config", str(tmp_path / "cfg.toml"), *(["-v"] if verbose else []), "list",
               env={"TEST_SUBSTITUTED_TOKEN": secret})
    assert done.returncode == 2, done.stderr
    assert secret not in done.stderr + done.stdout
    assert "plugins.filesystem.denied_paths: must be a list of paths or patterns, got '[REDACTED]'" in done.stderr
    # the setting is still named, with what it takes (it said "set plugins.filesystem.denied_paths", set already)
    assert "hint: plugins.filesystem.denied_paths must be a list of paths or patterns, got a string\n" in done.stderr


@pytest.mark.parametrize(("text", "key", "allowed"), [
    ('[plugins.filesystem]\nread_root = ["."]\n', "plugins.filesystem.read_root", "allowed_read_paths"),
    ("frobnicate = 1\n", "frobnicate", "working_dir"),
])
def test_an_unknown_key_with_no_close_match_is_told_to_go_not_to_be_set(tmp_path: Path, text: str, key: str,
                                                                        allowed: str) -> None:
    """Found by a new-user trial: a key with no close match got the command line's generic hint for a
    setting, "set plugins.filesystem.read_root in the configuration", naming the very key unknown."""
    from cli_helpers import cli

    (tmp_path / "cfg.toml").write_text(text)
    done = cli(tmp_path, "--config", str(tmp_path / "cfg.toml"), "list")
    assert done.returncode == 2, done.stderr
    hint = done.stderr.splitlines()[-1]
    leaf = key.rpartition(".")[2]
    assert hint.startswith(f"hint: remove or rename {leaf!r}; the keys allowed here: ") and allowed in hint, hint
    assert f"set {key}" not in done.stderr


async def test_a_configured_working_directory_that_does_not_exist_names_the_file(tmp_path: Path) -> None:
    """Found by a new-user trial: the error named no file (every other configuration error does),
    and its hint offered ``--working-dir``, which only serve-mcp has."""
    config = tmp_path / "amplifier-tools.toml"
    config.write_text(f"working_dir = {str(tmp_path / 'missing')!r}\n")
    with pytest.raises(ConfigError) as caught:
        await ToolHost(config=config, entry_points=False, discover=False).start()
    assert str(caught.value).startswith(f"{config}: working_dir: the working directory {tmp_path / 'missing'} "
                                        "does not exist")
    assert caught.value.hint == f"create the directory, or set working_dir in {config} to an existing one"
    with pytest.raises(ConfigError) as given:
        await ToolHost(working_dir=tmp_path / "missing", entry_points=False, discover=False).start()
    hint = str(given.value.hint)
    assert given.value.file is None and "--working-dir" in hint and "serve-mcp" in hint


def test_otel_without_opentelemetry_hints_the_install_not_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a new-user trial: ``[plugins.audit] otel = true`` without the extra said to install
    it, and the hint line then said "set plugins.audit.otel in the configuration"."""
    import sys

    from amplifier_tools.builtins.audit.otel import ToolTelemetry

    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ConfigError) as caught:
        ToolTelemetry()
    assert caught.value.key == "plugins.audit.otel"
    assert caught.value.hint == "pip install 'amplifier-tools[otel]', or set plugins.audit.otel = false"


def test_a_pyproject_named_without_our_table_is_refused_not_run_on_the_defaults(tmp_path: Path) -> None:
    """Found by attack: ``--config pyproject.toml`` (or ``AMPLIFIER_TOOLS_CONFIG``) naming a file
    without ``[tool.amplifier-tools]`` ran the host on its defaults without a word."""
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n')
    with pytest.raises(ConfigError, match=r"has no \[tool.amplifier-tools\] table") as info:
        load_config_file(pyproject)
    assert info.value.file == str(pyproject)
    assert info.value.hint is not None and "amplifier-tools.toml" in info.value.hint
