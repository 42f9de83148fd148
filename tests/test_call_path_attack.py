"""Attacks on the reworked call path (one coroutine per call, ``_begin``/``_Started``, the plugin
manager's ``generation`` as the dispatcher's only cache stamp)."""

from __future__ import annotations

from typing import Any

from helpers import ToolsPlugin

from amplifier_tools import Deny, hookimpl
from amplifier_tools.dispatch import PluginManager


class Guard:
    name = "guard"

    @hookimpl
    def tool_pre(self) -> Deny:
        return Deny("guarded")


class _Interleaved(PluginManager):
    """A plugin manager whose ``generation`` stores can be interrupted: ``interleave`` runs
    between the computing of an armed store's value and the store itself (the thread running
    ``invalidate()`` preempted inside it, as CPython 3.10 may between any two bytecodes)."""

    armed = False

    def interleave(self) -> None:
        raise NotImplementedError

    @property  # type: ignore[override]
    def generation(self) -> int:
        return int(self.__dict__.get("_stamp", 0))

    @generation.setter
    def generation(self, value: int) -> None:
        if self.armed:
            self.armed = False
            self.interleave()
        self.__dict__["_stamp"] = value


async def test_an_invalidate_preempted_by_a_registration_does_not_bring_back_a_stale_stamp(
        host_factory: Any, echo: Any) -> None:
    """``invalidate()`` moves the plugin manager's ``generation``, the stamp ``present()`` and
    ``impls()`` are cached for, which registrations move too. Found by attack: computed as
    ``generation + 1`` and stored after another thread's registration (during which the loop
    computed ``present()``, before the plugin's hooks were added), the store set the stamp back to
    the value ``present()`` was cached for: the registered guard never ran (before the rework,
    ``invalidate`` moved a counter of its own)."""
    host = await host_factory(ToolsPlugin(echo))
    assert (await host.call("echo", {"path": "warm"})).success
    pm = host.plugin_manager
    inner = pm.parse_hookimpl_opts
    fired = []

    def mid_registration(plugin: Any, name: str) -> Any:
        if name == "tool_pre" and not fired:  # the loop asks while the guard is being added
            fired.append(host.dispatcher.present())
        return inner(plugin, name)

    def interleave() -> None:  # "another thread" registers the guard
        pm.register(Guard(), name="guard")

    pm.__class__ = _Interleaved
    pm.__dict__["_stamp"] = pm.__dict__.get("generation", 0)
    pm.parse_hookimpl_opts = mid_registration  # type: ignore[method-assign]
    pm.interleave = interleave  # type: ignore[method-assign]
    pm.armed = True
    host.dispatcher.invalidate()
    assert fired and "tool_pre" not in fired[0] and pm.has_plugin("guard")
    result = await host.call("echo", {"path": "a"})
    assert not result.success and result.error["code"] == "denied"  # HEAD: the guard never ran
