"""The coordinator handed to ``mount``: the seed contract's surface, bound to one plugin.

Seed-style modules (``async def mount(coordinator, config)``) run unchanged
against it: ``mount``/``get``/``unmount`` for mount points (``"tools"`` goes to
the host's tool registry, with every hook and policy applied), capabilities
(the host provides ``session.working_dir``, ``session.state_dir``,
``session.protected_paths``), contributors, cleanups, and ``hooks`` — Amplifier's
hook registry (``amplifier_hooks.py``), also ``get("hooks")``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .amplifier_hooks import PluginHooks
from .redaction import chain_without_secrets

if TYPE_CHECKING:
    from .host import ToolHost

log = logging.getLogger("amplifier_tools")


class Coordinator:
    """What a plugin's ``mount`` gets: the host's registries, seen from that plugin."""

    def __init__(self, host: ToolHost, plugin: str, *, seed: bool = False) -> None:
        self._host = host
        self.plugin = plugin
        self._seed = seed
        #: Amplifier's hook registry surface; what this plugin registers is attributed to it.
        self.hooks = PluginHooks(host.events, plugin)
        self.session_id = host.session_id
        self.config = host.config

    async def mount(self, mount_point: str, obj: Any, name: str | None = None) -> None:
        """Mount ``obj`` at ``mount_point``; ``"tools"`` registers a tool with the host."""
        if mount_point == "tools":
            self._host.tools.add(obj, plugin=self.plugin, name=name, seed=self._seed)
            return
        key = name or getattr(obj, "name", None) or type(obj).__name__
        self._host.mounts.setdefault(mount_point, {})[key] = obj

    def get(self, mount_point: str, name: str | None = None) -> Any:
        """One mounted object by name, or all of a mount point as a dict."""
        if mount_point == "hooks":
            return self.hooks
        if mount_point == "tools":
            if name is None:
                return {m.spec.name: m.tool for m in self._host.tools}
            mounted = self._host.tools.resolve(name)
            return mounted.tool if mounted is not None else None
        items = self._host.mounts.get(mount_point, {})
        return dict(items) if name is None else items.get(name)

    async def unmount(self, mount_point: str, name: str | None = None) -> None:
        """Remove a mounted object (a tool by canonical or model name)."""
        if mount_point == "tools":
            if name is not None:
                self._host.tools.remove(name)
            return
        if name is None:
            self._host.mounts.pop(mount_point, None)
        else:
            self._host.mounts.get(mount_point, {}).pop(name, None)

    def register_capability(self, name: str, value: Any) -> None:
        """Offer a capability (a value or callable) to other plugins."""
        self._host.capabilities[name] = value

    def get_capability(self, name: str) -> Any:
        """A registered capability, or None."""
        return self._host.capabilities.get(name)

    def register_contributor(self, channel: str, name: str, callback: Callable[[], Any]) -> None:
        """Contribute to ``channel`` (e.g. ``observability.events``) under ``name``."""
        self._host.contributors.setdefault(channel, []).append((name, callback))

    async def collect_contributions(self, channel: str) -> list[Any]:
        """Each contributor's value for ``channel``, in registration order (failures logged, skipped)."""
        values = []
        for name, callback in self._host.contributors.get(channel, []):
            try:
                value = callback()
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:  # its traceback without the host's secrets (as a cleanup's failure)
                log.error("contributor %r to %r failed", name, channel,
                          exc_info=chain_without_secrets(exc, self._host.secrets))
                continue
            if value is not None:
                values.append(value)
        return values

    def register_cleanup(self, cleanup: Callable[[], Any | Awaitable[Any]]) -> None:
        """Run ``cleanup`` (sync or async) when the host closes, in reverse order."""
        self._host.cleanups.append((self.plugin, cleanup))
