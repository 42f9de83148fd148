"""Secrets that still came out, found by attack on the output channels: forms the redaction did not
search for (percent-encoding as ``quote`` (``/`` kept) and ``quote_plus``/``urlencode`` (a space as
``+``) write it, upper-case hex (the redaction module said it was found), JSON with ``/`` escaped as
``\\/``, the Python ``repr`` of a non-ASCII secret's bytes, the text a JSON-escaped secret stands
for); secrets the host itself cut in two before redacting (bash's head and tail, a failed command's
quoted tail, a reported failure's summary, ``fs_read_file``'s long lines); two overlapping secrets."""

from __future__ import annotations

import json
import os
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools import ToolHost, tool
from amplifier_tools.redaction import PLACEHOLDER, SecretSet, redact

VAR = "AMP_TEST_CHANNELS_SECRET"
CORE = uuid.uuid4().hex[:12]
# A slash, a space, a plus and a non-ASCII letter: each encoder writes it its own way.
SECRET = f"k/{CORE} p+é"


@tool(name="encodings", effect="Pure")
def encodings() -> Any:
    """Returns the host's secret as several standard encoders write it."""
    value = os.environ[VAR]
    raw = value.encode()
    return {"quote": f"https://h/x?k={urllib.parse.quote(value)}",
            "form": urllib.parse.urlencode({"token": value}),
            "hex": raw.hex().upper(),
            "php_json": json.dumps({"k": value}).replace("/", "\\/"),
            "bytes": raw}


def _places(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "w").mkdir(exist_ok=True)
    return {"working_dir": tmp_path / "w", "config": {"state_dir": str(tmp_path / "state")}}


def _visible(value: str) -> list[str]:
    """The parts of ``value`` that show the secret's core, for the failure message."""
    return [line for line in value.splitlines() if CORE in line or CORE.upper() in line
            or CORE.encode().hex().upper() in line]


async def test_standard_encodings_of_a_secret_are_redacted_from_the_result_and_the_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, SECRET)
    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"k": VAR}, "plugins": {"audit": {"record_output": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(encodings)], builtins=["audit"], entry_points=False,
                        discover=False, **places) as host:
        result = await host.call("encodings", {})
        log = Path(host.capabilities["audit.path"]).read_text()
    assert result.success, result.error
    assert result.output["quote"] == f"https://h/x?k={PLACEHOLDER}"
    assert result.output["form"] == f"token={PLACEHOLDER}"
    assert result.output["hex"] == PLACEHOLDER
    assert result.output["php_json"] == f'{{"k": "{PLACEHOLDER}"}}'
    assert result.output["bytes"] == f"b'{PLACEHOLDER}'"
    serialized = result.get_serialized_output(max_chars=None)
    hex_core = CORE.encode().hex()
    for where, text in (("the serialized output", serialized), ("the audit log", log)):
        assert CORE not in text and hex_core not in text.lower(), (where, _visible(text))


@pytest.mark.parametrize("secret, written", [
    ("a/b c+d=e", urllib.parse.quote),
    ("a/b c+d=e", urllib.parse.quote_plus),
    ("a/b c+d=e", lambda s: urllib.parse.urlencode({"q": s})[2:]),
    ("pass/word-123", lambda s: json.dumps(s).replace("/", "\\/")[1:-1]),
    ("pass/wörd-123", lambda s: json.dumps(s, ensure_ascii=False).replace("/", "\\/")[1:-1]),
    ("secret-value", lambda s: s.encode().hex().upper()),
    ("caf\u00e9-secret", lambda s: str(s.encode())),
    ("it's \"quoted\" \\ here", lambda s: str(s.encode())),
    ("it's \"quoted\" \\ here", lambda s: str({s})),
])
def test_each_encoding_is_found_by_redact(secret: str, written: Any) -> None:
    text = f"before {written(secret)} after"
    clean = redact({"v": text}, secrets=SecretSet([secret]), patterns=False)["v"]
    assert clean.startswith("before ") and clean.endswith(" after") and PLACEHOLDER in clean, clean


KEY_VAR = "AMP_TEST_CHANNELS_ONE_LINE_KEY"


@tool(name="restore_key", effect="Pure")
def restore_key() -> str:
    """Returns a key kept on one line (``\\n`` for its line ends) with its line ends restored."""
    return os.environ[KEY_VAR].replace("\\n", "\n")


async def test_a_secret_holding_json_escapes_is_redacted_when_its_text_is_returned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key kept in the environment on one line, ``\\n`` (backslash, n) for each line end, as
    service-account keys often are: the tool returns it with real line ends, which no form of the
    secret matched, and every JSON writer (the audit record, ``get_serialized_output`` of a
    structure, ``call --json``) then wrote the exact secret back."""
    key = f"key-{CORE}\\nline-two-{CORE}\\n"
    monkeypatch.setenv(KEY_VAR, key)
    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"key": KEY_VAR}, "plugins": {"audit": {"record_output": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(restore_key)], builtins=["audit"],
                        entry_points=False, discover=False, **places) as host:
        result = await host.call("restore_key", {})
        log = Path(host.capabilities["audit.path"]).read_text()
    assert result.success and result.output == PLACEHOLDER
    assert key not in log and CORE not in log
    assert key not in json.dumps(result.output)


BASH_VAR = "AMP_TEST_CHANNELS_BASH_SECRET"


@pytest.fixture
def bash_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    secret = f"cut-{CORE}-{uuid.uuid4().hex}"
    monkeypatch.setenv(BASH_VAR, secret)
    return secret


async def _bash(tmp_path: Path, command: str, **bash_config: Any) -> tuple[Any, str]:
    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"deploy": BASH_VAR},
              "plugins": {"bash": {"secrets": {"DEPLOY": "deploy"}, "sandbox": "off", **bash_config},
                          "audit": {"record_output": True}}}
    async with ToolHost(config=config, builtins=["bash", "audit"], entry_points=False, discover=False,
                        **places) as host:
        result = await host.call("bash", {"command": command})
        log = Path(host.capabilities["audit.path"]).read_text()
    return result, log


def _pieces(secret: str) -> list[str]:
    """Every run of 8 characters of ``secret``: none may be seen."""
    return [secret[i:i + 8] for i in range(len(secret) - 7)]


async def test_a_secret_cut_by_bashs_output_limit_is_redacted_on_both_sides_of_the_cut(
        tmp_path: Path, bash_secret: str) -> None:
    """Past ``max_output_bytes`` bash keeps the head and the tail of a stream; a secret the head's
    end or the tail's start cut through was shown all but a few characters (the host's redaction
    finds whole secrets only)."""
    half = 500  # max_output_bytes = 1000: a head and a tail of 500 bytes each
    command = (f'printf "%0{half - 10}d" 0; printf %s "$DEPLOY"; printf "%05000d" 0; '
               f'printf %s "$DEPLOY"; printf "%0{half - 12}d" 0')
    result, log = await _bash(tmp_path, command, max_output_bytes=2 * half)
    assert result.success, result.error
    out = result.output
    assert out["stdout_truncated"] is True
    head, tail = out["stdout"].split("\n[... ")
    assert head.endswith(PLACEHOLDER) and tail.split("...]\n")[1].startswith(PLACEHOLDER), out["stdout"]
    for where, text in (("the result", repr(result)), ("the audit log", log)):
        assert [p for p in _pieces(bash_secret) if p in text] == [], where


async def test_a_secret_cut_by_the_quoted_tail_of_a_failed_commands_output_is_redacted(
        tmp_path: Path, bash_secret: str) -> None:
    """A failed command's error message quotes the last 600 characters of its stderr: a secret
    that quote began inside showed its end there."""
    command = 'printf %s "$DEPLOY" >&2; printf "%0590d" 0 >&2; exit 3'
    result, log = await _bash(tmp_path, command)
    assert not result.success and result.error["code"] == "nonzero_exit"
    assert f"---\n{PLACEHOLDER}000" in result.error["message"], result.error["message"][:200]
    assert result.error["stderr"].startswith(PLACEHOLDER)
    for where, text in (("the result", repr(result)), ("the audit log", log)):
        assert [p for p in _pieces(bash_secret) if p in text] == [], where


def test_redact_cut_replaces_only_a_secret_the_cut_goes_through() -> None:
    from amplifier_tools.redaction import redact_cut

    secrets = SecretSet(["SEC0123456789abcdef"])
    assert redact_cut("000SEC0123", secrets, cut_after=True) == f"000{PLACEHOLDER}"
    assert redact_cut("89abcdef000", secrets, cut_before=True) == f"{PLACEHOLDER}000"
    assert redact_cut("x SEC0123456789abcdef y", secrets) == f"x {PLACEHOLDER} y"
    # fewer than 4 of its characters at the cut, or a cut not said: kept
    assert redact_cut("000SEC", secrets, cut_after=True) == "000SEC"
    assert redact_cut("def000", secrets, cut_before=True) == "def000"
    assert redact_cut("000SEC0123", secrets) == "000SEC0123"
    assert redact_cut("000SEC0123", (), cut_after=True) == "000SEC0123"


ODD_SECRETS = [["k/a b+é-secret"], ["line-one\\nline-two"], ["it's \"q\" \\ x"]]
FRAGMENTS = ["k/a b+é-secret", "line-one\nline-two", "line-one\\nline-two", "it's \"q\" \\ x", "\\", "\"",
             "'", "\n", "k\\/a b+\\u00e9", "k%2Fa%20b", "k/a+b%2B", "b'", "\\'", "6b2f61", " ", "x"]


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.lists(st.sampled_from(FRAGMENTS), max_size=5).map("".join)
                    | st.binary(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FRAGMENTS), inner,
                                                                                  max_size=3),
                    max_leaves=8),
       st.sampled_from(ODD_SECRETS))
def test_the_fast_path_still_scrubs_what_the_full_walk_scrubs_with_the_new_forms(value: Any,
                                                                                secrets: list[str]) -> None:
    from amplifier_tools.redaction import _matcher, _redact_strings

    assert redact(value, secrets=secrets, patterns=False) == _redact_strings(value, _matcher(secrets), False)


async def test_a_secret_cut_by_a_reported_failures_summary_is_redacted(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure reported without a message is summarized from the first 500 characters of its
    output: a secret that summary's cut went through showed all but its end in the message."""
    secret = f"sum-{CORE}-{uuid.uuid4().hex}"
    monkeypatch.setenv(VAR, secret)

    @tool(name="fails_quietly", effect="Pure")
    def fails_quietly() -> Any:
        """Reports a failure whose output holds the secret across the summary's cut."""
        from amplifier_tools import ToolResult

        return ToolResult(False, "x" * 480 + os.environ[VAR] + "y" * 100)

    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"k": VAR}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(fails_quietly)], builtins=["audit"],
                        entry_points=False, discover=False, **places) as host:
        result = await host.call("fails_quietly", {})
        log = Path(host.capabilities["audit.path"]).read_text()
    assert not result.success and result.error["message"].endswith(f"x{PLACEHOLDER} …")
    for where, text in (("the result", repr(result)), ("the audit log", log)):
        assert [p for p in _pieces(secret) if p in text] == [], where


async def test_a_secret_cut_by_read_files_line_limit_is_redacted(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``fs_read_file`` cuts a line past ``max_line_chars``: a secret the cut went through showed
    all but its end."""
    secret = f"line-{CORE}-{uuid.uuid4().hex}"
    monkeypatch.setenv(VAR, secret)
    places = _places(tmp_path)
    (places["working_dir"] / "long.txt").write_text("a" * 90 + secret + "b" * 50 + "\nshort\n")
    config = {**places.pop("config"), "secrets": {"k": VAR},
              "plugins": {"filesystem": {"max_line_chars": 100}}}
    async with ToolHost(config=config, builtins=["filesystem"], entry_points=False, discover=False,
                        **places) as host:
        result = await host.call("fs_read_file", {"path": "long.txt"})
    assert result.success, result.error
    assert result.output["truncated_lines"] == 1
    assert f"a{PLACEHOLDER} … [line truncated]" in result.output["content"]
    assert [p for p in _pieces(secret) if p in repr(result)] == []


async def test_two_secrets_that_overlap_in_the_output_are_both_redacted(tmp_path: Path) -> None:
    """Two secrets sharing a middle (``A-shared`` and ``shared-B``) written as one run: the first
    was replaced and the rest of the second, all but the shared part, stayed in view."""
    first, second = f"one-{CORE}-shared-middle", f"shared-middle-{uuid.uuid4().hex}"
    places = _places(tmp_path)
    async with ToolHost(config=places.pop("config"), plugins=[ToolsPlugin(echo_text)], builtins=False,
                        entry_points=False, discover=False, **places) as host:
        host.secrets.update([first, second])
        run = f"one-{CORE}-shared-middle-{second[len('shared-middle-'):]}"
        result = await host.call("echo_text", {"text": f"<{run}> <{second}{first}>"})
    assert result.output == f"<{PLACEHOLDER}> <{PLACEHOLDER}{PLACEHOLDER}>"
    chained = SecretSet(["aaaa1111", "1111bbbb", "bbbb2222"])
    assert redact(["-aaaa1111bbbb2222-", "ab aaaa1111 1111bbbb"], secrets=chained, patterns=False) == \
        [f"-{PLACEHOLDER}-", f"ab {PLACEHOLDER} {PLACEHOLDER}"]


@tool(name="echo_text", effect="Pure")
def echo_text(text: str) -> str:
    """Echo."""
    return text
