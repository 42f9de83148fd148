"""The mounted tools: contract, compiled validators and model-facing names.

Everything a call needs about a tool is computed here once, at mount time:
the spec (with host overrides applied), the compiled input and output
validators, whether ``execute`` takes a context, and the short name. A call
then costs one dict lookup.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import attrs

from .definitions import model_name
from .errors import ConfigError, ContractError
from .schema import Validator, check_json_data, compile_validator, describe_errors, is_plain_json
from .spec import ToolSpec, spec_from_tool


@attrs.frozen(slots=True)
class MountedTool:
    """A tool as the host runs it."""

    spec: ToolSpec
    tool: Any
    plugin: str
    model_name: str
    input_validator: Validator
    output_validator: Validator | None
    execute: Callable[..., Any]
    takes_context: bool
    #: A seed-style module's tool: its input also carries ``_tool_call_id`` (after validation), as
    #: Amplifier's orchestrators pass it.
    seed: bool = False

    def check_arguments(self, arguments: Any, plugin: str | None = None) -> None:
        """Raise ``ContractError`` unless ``arguments`` are a JSON object of plain JSON data that the
        input schema accepts: a call's arguments, and again those a ``tool_pre`` plugin rewrote
        (``plugin``: named in the error; positional, as the hook chain calls this bound method)."""
        if type(arguments) is dict:
            validator = self.input_validator
            accepts_plain = validator.accepts_plain  # a field holding a function (see ``_begin``'s ``execute``)
            if accepts_plain(arguments):
                return  # the common call: plain JSON the schema accepts, by one generated predicate
            if is_plain_json(arguments):
                if validator.is_valid(arguments):
                    return  # plain JSON the schema accepts, without the layers that explain a refusal
                self.refuse_input(arguments, plugin=plugin)  # asked once: a refusal is not validated twice
        if not isinstance(arguments, dict):
            who = f"plugin {plugin!r} rewrote " if plugin else ""
            raise ContractError(
                f"{who}arguments for tool {self.spec.name!r} must be a JSON object, got {type(arguments).__name__}",
                code="invalid_input",
                pointer="",
                plugin=plugin,
            )
        try:
            check_json_data(arguments)
        except ContractError as exc:
            raise ContractError(
                f"arguments for tool {self.spec.name!r}{_rewritten_by(plugin)} are not JSON data: {exc.message}",
                code="invalid_json",
                pointer=exc.details.get("pointer", ""),
                plugin=plugin,
            ) from None
        self.check_input(arguments, plugin=plugin)

    def check_input(self, arguments: Any, *, plugin: str | None = None) -> None:
        """Raise ``ContractError`` naming the first bad field (by JSON pointer)."""
        if not self.input_validator.is_valid(arguments):
            self.refuse_input(arguments, plugin=plugin)

    def refuse_input(self, arguments: Any, *, plugin: str | None = None) -> NoReturn:
        """Raise the ``ContractError`` for ``arguments`` the input schema refused (already asked)."""
        pointer, message = describe_errors(self.input_validator, arguments)
        raise ContractError(
            f"invalid arguments for tool {self.spec.name!r}{_rewritten_by(plugin)}: {message}",
            code="invalid_input",
            pointer=pointer,
            plugin=plugin,
        )

    def check_output(self, output: Any, *, plugin: str | None = None) -> None:
        """Raise ``ContractError`` when ``output`` breaks the declared output schema."""
        if self.output_validator is None:
            return
        try:
            if self.output_validator.is_valid(output):
                return
            pointer, message = describe_errors(self.output_validator, output)
        except Exception as exc:
            # jsonschema quotes the value in its messages, in checking too: an output whose
            # ``__repr__`` raises read as the host's internal error (found by attack)
            pointer, message = "", f"it could not be checked ({type(exc).__name__} from the output's own methods)"
        who = f"plugin {plugin!r} replaced the output of" if plugin else "output of"
        raise ContractError(
            f"{who} tool {self.spec.name!r} violates its output schema: {message}",
            code="invalid_output",
            pointer=pointer,
            plugin=plugin,
        )


def _rewritten_by(plugin: str | None) -> str:
    """What an argument refusal says of the plugin whose ``Modify`` it refused (nothing for a caller's)."""
    return f" (rewritten by plugin {plugin!r})" if plugin else ""


def _takes_context(execute: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(execute).parameters
    except (TypeError, ValueError):
        return False
    return "context" in parameters


def apply_overrides(spec: ToolSpec, overrides: Mapping[str, Any], *, key: str) -> ToolSpec:
    """``spec`` with host config overrides (policies, security, effect ...) merged in.

    Raises ``ConfigError`` naming ``key`` and the field on unknown or invalid keys.
    """
    from ._converter import converter, describe_structure_error
    from .plugin_settings import check_json_types

    data = converter.unstructure(spec)
    merged = _deep_merge(data, dict(overrides), key)
    check_json_types(overrides, ToolSpec, key)  # unknown keys first (_deep_merge), then types as written
    try:
        result: ToolSpec = converter.structure(merged, ToolSpec)
    except Exception as exc:
        described = describe_structure_error(exc).replace("@ $", f"@ {key}")
        problem, at, where = described.rpartition(" @ ")
        if at and "; " not in described:  # one problem: its own key leads the message, as every other's
            raise ConfigError(problem, key=where) from exc
        raise ConfigError(described, key=key) from exc
    return result


def _deep_merge(base: dict[str, Any], override: dict[str, Any], key: str) -> dict[str, Any]:
    """``base`` (an unstructured ``ToolSpec``) with ``override`` merged in, table by table; an unknown
    key is a ``ConfigError`` with a did-you-mean, or, for a key of a table below (``timeout_ms`` of
    ``policies``), the key it belongs at (found by attack: ``[tools.x] timeout_ms`` had no hint)."""
    out = dict(base)
    for name, value in override.items():
        if name not in base:
            home = next((table for table, fields in base.items() if isinstance(fields, dict) and name in fields), None)
            hint = f"it belongs in a table below: {key}.{home}.{name}" if home is not None else None
            raise ConfigError(f"unknown key {name!r} (not a ToolSpec field)", key=f"{key}.{name}", hint=hint,
                              expected=sorted(base))
        if isinstance(value, Mapping) and isinstance(base[name], dict):
            out[name] = _deep_merge(base[name], dict(value), f"{key}.{name}")
        else:
            out[name] = value
    return out


class ToolRegistry:
    """Tools by canonical name, with the short-name map kept in step."""

    def __init__(self, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._tools: dict[str, MountedTool] = {}
        self._by_model_name: dict[str, str] = {}
        self._overrides = dict(overrides or {})

    def add(self, tool: Any, *, plugin: str, name: str | None = None, seed: bool = False) -> MountedTool:
        """Mount ``tool``: derive and check its contract, compile its validators."""
        spec = spec_from_tool(tool, name=name)
        override = self._overrides.get(spec.name)
        if override:
            spec = apply_overrides(spec, override, key=f"tools.{spec.name}")
        if spec.policies.retry is not None and not spec.effect.retry_safe:
            message = (f"tool {spec.name!r} is {spec.effect.value}: it must never be retried automatically, "
                       "remove policies.retry")
            if override and "retry" in dict(override.get("policies", {})):
                raise ConfigError(message, key=f"tools.{spec.name}.policies.retry")
            if override and "effect" in override:
                # found by attack: reported as the tool's own invalid contract, naming no key
                raise ConfigError(f"tool {spec.name!r} declares policies.retry, which a {spec.effect.value} tool "
                                  "must never have (it would be retried automatically)",
                                  key=f"tools.{spec.name}.effect",
                                  hint=f"remove tools.{spec.name}.effect, or set it to Pure or IdempotentWrite")
            raise ContractError(message, code="invalid_contract")
        if spec.name in self._tools:
            raise ContractError(
                f"tool {spec.name!r} from plugin {plugin!r} is already mounted by plugin "
                f"{self._tools[spec.name].plugin!r}",
                code="duplicate_tool",
                plugins=[self._tools[spec.name].plugin, plugin],
            )
        short = model_name(spec.name)
        owner = self._by_model_name.get(short)
        if owner is not None and owner != spec.name:
            raise ContractError(
                f"tool {spec.name!r} from plugin {plugin!r} has the model name {short!r}, already used by tool "
                f"{owner!r} of plugin {self._tools[owner].plugin!r}",
                code="duplicate_tool",
                plugins=[self._tools[owner].plugin, plugin],
            )
        # A tool whose schemas come from outside the host names a linear-time regex engine.
        patterns = getattr(tool, "pattern_engine", None)
        input_validator = compile_validator(spec.input_schema, owner=spec.name, which="input_schema",
                                            patterns=patterns)
        if spec.input_schema.get("type", "object") != "object":
            raise ContractError(
                f"tool {spec.name!r}: input_schema must describe an object (type 'object')",
                code="invalid_schema",
            )
        output_validator = (
            compile_validator(spec.output_schema, owner=spec.name, which="output_schema", patterns=patterns)
            if spec.output_schema is not None
            else None
        )
        execute = tool.execute
        mounted = MountedTool(
            spec=spec,
            tool=tool,
            plugin=plugin,
            model_name=short,
            input_validator=input_validator,
            output_validator=output_validator,
            execute=execute,
            takes_context=_takes_context(execute),
            # A ``@tool`` function mounted by a seed-style module is ours, not Amplifier's: its
            # parameters are its input schema, and a ``_tool_call_id`` keyword would fail every call
            # with TypeError (found by a newcomer's trial: ``coordinator.mount("tools", f)`` in a
            # ``[[modules]]`` module).
            seed=seed and not _is_function_tool(tool),
        )
        self._tools[spec.name] = mounted
        self._by_model_name[short] = spec.name
        return mounted

    def remove(self, name: str) -> MountedTool | None:
        """Unmount a tool by canonical or model name."""
        mounted = self.resolve(name)
        if mounted is None:
            return None
        del self._tools[mounted.spec.name]
        del self._by_model_name[mounted.model_name]
        return mounted

    def resolve(self, name: str) -> MountedTool | None:
        """The tool called ``name`` (canonical or model-facing), or None."""
        mounted = self._tools.get(name)
        if mounted is None:
            canonical = self._by_model_name.get(name)
            if canonical is not None:
                mounted = self._tools.get(canonical)
        return mounted

    def suggest(self, name: str) -> list[str]:
        """Up to three mounted tools close to ``name``, each named once (by whichever of its
        canonical and model-facing names is closer), for an "unknown tool" message."""
        names = list(dict.fromkeys([*self._tools, *self._by_model_name]))
        if not names:
            return []
        import difflib  # only for an unknown name, not at every start

        found: dict[str, str] = {}  # canonical name -> the spelling suggested
        for close in difflib.get_close_matches(str(name), names, n=len(names)):
            found.setdefault(self._by_model_name.get(close, close), close)
        return list(found.values())[:3]

    def unused_overrides(self) -> list[str]:
        """Override sections that matched no mounted tool (a config error)."""
        return [name for name in self._overrides if name not in self._tools]

    def __iter__(self) -> Iterator[MountedTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


def _is_function_tool(tool: Any) -> bool:
    """Whether ``tool`` is an ``@amplifier_tools.tool`` function (its module is only looked at when
    it was imported: a host that mounts none does not pay for the import)."""
    module = sys.modules.get("amplifier_tools.function_tool")
    return module is not None and isinstance(tool, module.FunctionTool)
