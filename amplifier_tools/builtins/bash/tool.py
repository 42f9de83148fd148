"""The ``local::bash`` tool: contract, environment, working directory, and the result of one run.

Order of one call: command rules (advice) -> working directory through the
path rules -> scrubbed environment (+ configured values and secrets) ->
spawn (sandboxed or not, rlimits, optional user) -> bounded capture until
exit, timeout or cancellation -> whole-group kill -> result.

Must never run a command that failed a rule or whose sandbox could not be set
up, and never let the host's environment through except the allowlisted names.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

import attrs

from ... import sandbox as engine
from ...errors import ContractError, ExecutionError, ToolSystemError
from ...hoststate import ProtectedPath, ProtectedPaths
from ...models import ToolContext, ToolResult
from ...redaction import SecretSet, redact_cut
from ...seccomp import filter_fd
from ...spec import Policies, Security, ToolSpec
from ...termination import KILL_WAIT
from ..filesystem.paths import PathRules
from . import process, sandbox
from .capture import StreamCapture, open_spill_files
from .rules import CommandRules

log = logging.getLogger(__name__)

VERSION: Final = "1.0.0"
BASE_ENV: Final = ("PATH", "HOME", "LANG", "TERM")
DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
MESSAGE_TAIL: Final = 600  # characters of stderr/stdout quoted in a failure message
#: Linux's MAX_ARG_STRLEN (32 pages: 128 KiB with 4 KiB pages, 2 MiB with 64 KiB pages on some arm64
#: and ppc64 kernels): the most bytes one program argument holds, its NUL included.
MAX_ARGUMENT_BYTES: Final = 32 * os.sysconf("SC_PAGE_SIZE")


@attrs.frozen
class Settings:
    """The plugin's parsed configuration, as the tool uses it."""

    default_timeout: float
    max_timeout: float
    kill_grace: float
    max_output_bytes: int
    spill_dir: str | None
    env_allowlist: tuple[str, ...]
    env: dict[str, str]
    secrets: dict[str, str]  # environment variable -> secret reference
    rules: CommandRules
    sandbox: bool  # confined ("auto", "bubblewrap") or not ("off")
    sandbox_unavailable: str | None  # why no sandbox works on this host (calls then fail), or None
    sandbox_network: bool
    sandbox_read_paths: tuple[str, ...]  # resolved; bound read-only besides the system directories
    sandbox_write_paths: tuple[str, ...]  # resolved; bound read-write besides the write roots
    user: tuple[int, int] | None
    limits: process.Limits
    bash: str
    prlimit: str | None
    bwrap: str | None  # resolved
    #: Every path the session's tools and sandboxed processes may write (``session.writable_roots``,
    #: held by reference: plugins mounting after this one, MCP servers, add theirs); no call runs a
    #: ``bwrap`` inside one.
    session_writable: Sequence[str] = ()


OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "stdout": {"type": "string", "description": "head and tail of stdout, a marker between them when cut"},
        "stderr": {"type": "string"},
        "stdout_bytes": {"type": "integer", "description": "total bytes the command wrote to stdout"},
        "stderr_bytes": {"type": "integer"},
        "stdout_truncated": {"type": "boolean"},
        "stderr_truncated": {"type": "boolean"},
        "stdout_file": {"type": "string", "description": "the full stdout (with spill_dir configured)"},
        "stderr_file": {"type": "string"},
        "stdout_file_error": {"type": "string", "description": "why stdout_file is incomplete (e.g. the disk is full)"},
        "stderr_file_error": {"type": "string"},
        "exit_code": {"type": ["integer", "null"], "description": "null when killed by a signal"},
        "signal": {"type": ["string", "null"], "description": "e.g. SIGKILL when killed by a signal"},
        "timed_out": {"type": "boolean"},
        "timeout_s": {"type": "number", "description": "the timeout applied (after capping)"},
        "duration_ms": {"type": "number"},
        "cwd": {"type": "string"},
        "sandboxed": {"type": "boolean"},
    },
    "required": ["stdout", "stderr", "stdout_bytes", "stderr_bytes", "stdout_truncated", "stderr_truncated",
                 "exit_code", "signal", "timed_out", "duration_ms", "cwd", "sandboxed"],
}


def make_spec(settings: Settings) -> ToolSpec:
    # The host's own timeout backstops ours: it must leave room for the kill and the drain.
    backstop = settings.max_timeout + settings.kill_grace + KILL_WAIT + process.DRAIN_AFTER_EXIT + 5
    return ToolSpec(
        name="local::bash", version=VERSION, title="Run a shell command",
        description=(
            "Run a command line with bash -c in the working directory (or 'cwd', which must be inside the "
            "allowed roots), stdin closed, a scrubbed environment, and a timeout (default "
            f"{settings.default_timeout:g} s, at most {settings.max_timeout:g} s). Returns exit code, signal, "
            "duration and stdout/stderr (head and tail when long, with byte totals). A non-zero exit is a "
            "failure carrying both streams. Every process the command started is killed when it ends, times "
            "out or is cancelled. No interactive input, no TTY."
            + _confinement(settings)),
        tags=("shell", "exec", "sandboxed" if settings.sandbox else "unconfined"), effect="ExternalSideEffects",
        input_schema={"type": "object", "properties": {
            "command": {"type": "string", "minLength": 1, "description": "The command line (bash syntax)"},
            "timeout": {"type": "number", "exclusiveMinimum": 0,
                        "description": f"Seconds before the command is killed (default "
                                       f"{settings.default_timeout:g}; values above {settings.max_timeout:g} "
                                       "are capped)"},
            "cwd": {"type": "string", "minLength": 1,
                    "description": "Working directory, relative to the session's working directory"},
        }, "required": ["command"], "additionalProperties": False},
        output_schema=OUTPUT_SCHEMA,
        examples=[
            {"input": {"command": "echo hi"}, "description": "typical",
             "output": {"stdout": "hi\n", "stderr": "", "stdout_bytes": 3, "stderr_bytes": 0,
                        "stdout_truncated": False, "stderr_truncated": False, "exit_code": 0, "signal": None,
                        "timed_out": False, "timeout_s": 120, "duration_ms": 2.4, "cwd": "/srv/project",
                        "sandboxed": True}},
            {"input": {"command": "ls missing-file"}, "error_code": "nonzero_exit",
             "description": "a failing command: ExecutionError with stdout and stderr"},
            {"input": {"command": "sleep 100", "timeout": 1}, "error_code": "timeout",
             "description": "killed after 1 s with its output so far"},
            {"input": {"command": "pwd", "cwd": "/etc"}, "error_code": "path_denied",
             "description": "a working directory outside the allowed roots"},
        ],
        policies=Policies(timeout_ms=backstop * 1000.0),
        security=Security(secret_refs=tuple(sorted(set(settings.secrets.values())))),
    )


def _confinement(settings: Settings) -> str:
    """The description's last sentence: how the command is confined (``describe local::bash`` shows it)."""
    if not settings.sandbox:
        return (" UNCONFINED (sandbox = \"off\"): the command runs as the host's user and sees the host's whole "
                "filesystem, processes and network.")
    if settings.sandbox_unavailable is not None:
        return f" Sandbox required but unavailable on this host ({settings.sandbox_unavailable}): every call fails."
    return (" Runs in a bubblewrap sandbox: read-only system directories, writable working directory, private "
            "/tmp, no home directories, no host processes" + ("." if settings.sandbox_network else ", no network."))


class BashTool:
    """Runs one command per call; see the module docstring for the order of steps."""

    def __init__(self, settings: Settings, path_rules: Callable[[], PathRules], *,
                 secrets: Collection[str] | SecretSet = ()) -> None:
        self.settings = settings
        self.path_rules = path_rules
        #: The host's secrets (``session.secrets``): redacted where this tool cuts the output short,
        #: before the host redacts the whole result (a secret cut in two is no longer found then).
        self.secrets = secrets
        self.spec = make_spec(settings)
        self.name = self.spec.name
        self.description = self.spec.description

    def environment(self, context: ToolContext) -> dict[str, str]:
        """The command's environment: allowlisted host names, configured values, then secrets."""
        s = self.settings
        env = {name: os.environ[name] for name in (*BASE_ENV, *s.env_allowlist) if name in os.environ}
        env.setdefault("PATH", DEFAULT_PATH)
        env.update(s.env)
        for name, ref in s.secrets.items():
            env[name] = context.secret(ref)
        return env

    def working_directory(self, cwd: str | None) -> tuple[str, tuple[str, ...], ProtectedPaths]:
        """The resolved working directory (inside the write roots, not protected), the write roots,
        and the host's protected paths (as they are now: plugins may add to them)."""
        rules = self.path_rules()
        try:
            with rules.open_dir(cwd or rules.working_dir, write=True) as (_, resolved):
                return resolved.path, rules.write_roots, rules.protected
        except ContractError as exc:  # the path rules name their own argument, /path (found by review)
            if exc.details.get("pointer") == "/path":
                exc.details["pointer"] = "/cwd"
            raise

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolResult:
        s = self.settings
        command: str = input["command"]
        if "\x00" in command:  # found by attack: exec refused it as an untyped ValueError
            raise ContractError("the command holds a NUL character, which no program argument can",
                                code="invalid_input", pointer="/command")
        try:
            size = len(os.fsencode(command))
        except UnicodeEncodeError as exc:  # found by review: it failed as ``tool_raised`` UnicodeEncodeError
            raise ContractError(f"the command holds a lone surrogate (U+{ord(command[exc.start]):04X}, at character "
                                f"{exc.start}), which no program argument can encode", code="invalid_input",
                                pointer="/command") from None
        if size >= MAX_ARGUMENT_BYTES:  # found by attack: exec's E2BIG read as the sandbox's or the system's failure
            raise ContractError(f"the command is {size:,} bytes; Linux passes at most {MAX_ARGUMENT_BYTES - 1:,} bytes "
                                "in one program argument (MAX_ARG_STRLEN)", code="invalid_input", pointer="/command",
                                hint="write the script to a file in the working directory and run that: bash script.sh")
        s.rules.check(command)
        cwd, writable, protected = self.working_directory(input.get("cwd"))
        env = self.environment(context)
        timeout = min(float(input.get("timeout", s.default_timeout)), s.max_timeout)

        argv = [s.bash, "-c", command]
        popen: dict[str, Any] = {}
        if s.prlimit is not None:
            argv = s.limits.prlimit_argv(s.prlimit) + argv
        else:  # no prlimit(1) on this system: the (thread-unsafe) preexec_fn is the only way left
            preexec = s.limits.preexec()
            if preexec is not None:
                popen["preexec_fn"] = preexec
        if s.user is not None:
            popen.update(user=s.user[0], group=s.user[1], extra_groups=[])
        view = None
        if s.sandbox:
            if s.bwrap is None or s.sandbox_unavailable is not None:
                raise engine.unavailable(s.sandbox_unavailable or "'bwrap' was not found on PATH", "[plugins.bash]")
            view = engine.View(cwd=cwd, writable=(*writable, *s.sandbox_write_paths),
                               read_only=(*engine.SYSTEM_PATHS, *s.sandbox_read_paths),
                               protected=tuple(entry.path for entry in protected if not entry.alias),
                               network=s.sandbox_network)
            # bwrap's own exec of a program missing from the view is a failed setup, but not prlimit's exec
            # of bash (exit 127), nor the start probe's (found by attack: "command exited with code 127")
            for program in (s.bash, *([s.prlimit] if s.prlimit is not None and s.limits.items() else [])):
                places = (os.path.abspath(program), os.path.realpath(program))
                if not all(engine.visible(path, view) for path in places):
                    raise ToolSystemError(f"{program} is not in the sandbox's view (add its directory to "
                                          "[plugins.bash] sandbox_read_paths); the command was not run",
                                          code="sandbox_failed", path=program)
            holder = engine.writable_by_commands(s.bwrap, (*view.writable, *s.session_writable), resolve=False)
            if holder is not None:  # a path added since the start (an MCP server's write path) holds it
                raise ToolSystemError(f"the sandbox's bwrap {s.bwrap} lies inside {holder}, which commands may "
                                      "write; nothing was run", code="sandbox_failed", path=s.bwrap)
        # A protected path that does not exist cannot be masked: notice one the command makes. Only inside
        # the writable roots, and only paths no plugin creates (a keyed path is host state, e.g. an audit
        # log the host may create meanwhile): in practice the config file and its location.
        missing = [entry for root in (*writable, *s.sandbox_write_paths) for entry in protected.inside(root)
                   if entry.key is None and not os.path.lexists(entry.path)]
        status_r = status_w = info_r = info_w = seccomp_r = -1
        reports_exit = False
        captures: list[StreamCapture] = []
        sandbox_processes: engine.SandboxProcesses | None = None  # which the signals to bwrap's group miss
        try:
            if view is not None and s.bwrap is not None:
                status_r, status_w = os.pipe()
                reports_exit = engine.reports_exit(s.bwrap)
                if not reports_exit:  # the start probe's dash takes single-digit descriptors only
                    status_w = sandbox.low_status_fd(status_w)
                info_r, info_w = os.pipe()
                sandbox_processes = engine.SandboxProcesses(info_r)
                seccomp_r = filter_fd()
                # Raises (sandbox_failed) for a protected path it cannot hide, before anything is made.
                argv = sandbox.bwrap_argv(s.bwrap, view, status_fd=status_w, bash=s.bash, info_fd=info_w,
                                          seccomp_fd=seccomp_r, reports_exit=reports_exit) + argv
                popen["pass_fds"] = (status_w, info_w, seccomp_r)
            out_spill = err_spill = None
            if s.spill_dir is not None:  # fails the call, before anything runs, when the files cannot be made safely
                out_spill, err_spill = open_spill_files(s.spill_dir,
                                                        f"{context.call_id or 'call'}-{uuid.uuid4().hex[:8]}")
            stdout = StreamCapture(s.max_output_bytes, out_spill)
            captures.append(stdout)
            stderr = StreamCapture(s.max_output_bytes, err_spill)
            captures.append(stderr)
            try:
                outcome = await process.run(argv, env=env, cwd=cwd, timeout=timeout, grace=s.kill_grace,
                                            stdout=stdout, stderr=stderr, popen=popen,
                                            others=sandbox_processes)
            except OSError as exc:
                if s.sandbox:
                    raise ToolSystemError(f"could not start bwrap: {exc.strerror}", code="sandbox_failed") from None
                raise ExecutionError(f"could not start bash: {exc.strerror}", code="spawn_failed") from None
            finally:
                if sandbox_processes is not None:  # bwrap is dead: so must its namespace be (even when cancelled)
                    os.close(info_w)
                    info_w = -1
                    first = sandbox_processes.first()
                    if not await engine.wait_namespace_gone(first, KILL_WAIT):
                        log.warning("bash: the sandbox of call %s (first process %s) was still running %.0f s "
                                    "after its end", context.call_id, first, KILL_WAIT)
            if s.sandbox:
                os.close(status_w)
                status_w = -1
                if not outcome.timed_out:  # a timeout that cut bwrap's setup is the timeout (found by CI:
                    # "the sandbox failed to start" for a 1e-6 s timeout, one call in thirty)
                    sandbox.check_started(engine.read_pipe(status_r), stderr.text(), reports_exit=reports_exit,
                                          returncode=outcome.returncode)
                outcome.returncode = sandbox.returncode(outcome.returncode)
        finally:
            for capture in captures:
                capture.close()
            for fd in (status_r, status_w, info_r, info_w, seccomp_r):
                if fd != -1:
                    os.close(fd)
        planted = [entry for entry in missing if os.path.lexists(entry.path)]
        return self.result(outcome, stdout, stderr, cwd, timeout, planted)

    def result(self, outcome: process.Outcome, stdout: StreamCapture, stderr: StreamCapture, cwd: str,
               timeout: float, planted: list[ProtectedPath] | None = None) -> ToolResult:
        exit_code, signal_name = process.describe_returncode(outcome.returncode)
        output: dict[str, Any] = {
            **stdout.summary("stdout", self.secrets), **stderr.summary("stderr", self.secrets),
            "exit_code": exit_code, "signal": signal_name, "timed_out": outcome.timed_out,
            "timeout_s": timeout, "duration_ms": round(outcome.duration * 1000.0, 3), "cwd": cwd,
            "sandboxed": self.settings.sandbox,
        }
        if planted:
            what = "; ".join(f"{entry.path} ({entry.reason})" for entry in planted)
            message = (f"a path the host protects appeared while the command ran: {what}. It was left in "
                       "place; the operator should remove it (a configuration file there would be read by the "
                       "next host started in this directory)")
            return self._failure(output, "AuthError", "path_protected", message, self.secrets,
                                 path=planted[0].path, reason=planted[0].reason)
        if outcome.timed_out:
            message = f"command timed out after {timeout:g} s and was killed with its process group"
            return self._failure(output, "PolicyError", "timeout", message, self.secrets)
        if exit_code != 0:
            how = f"was killed by {signal_name}" if signal_name else f"exited with code {exit_code}"
            return self._failure(output, "ExecutionError", "nonzero_exit", f"command {how}", self.secrets)
        return ToolResult(output=output)

    @staticmethod
    def _failure(output: dict[str, Any], category: str, code: str, message: str,
                 secrets: Collection[str] | SecretSet = (), **extra: Any) -> ToolResult:
        quoted = []
        for name in ("stderr", "stdout"):
            text = output[name].strip()
            if text:
                # the last part, a secret it cuts in two redacted (found by attack: the message showed its end)
                tail = redact_cut(text[-MESSAGE_TAIL:], secrets, cut_before=len(text) > MESSAGE_TAIL)
                quoted.append(f"--- {name}{' (last part)' if len(text) > MESSAGE_TAIL else ''} ---\n{tail}")
        full = "\n".join([message, *quoted])
        error = {"type": category, "code": code, "message": full, "exit_code": output["exit_code"],
                 "signal": output["signal"], "timed_out": output["timed_out"],
                 "stdout": output["stdout"], "stderr": output["stderr"], **extra}
        return ToolResult(success=False, output=output, error=error)
