"""``[plugins.audit]``: the settings of the audit plugin.

Structured by ``plugin_settings.structure_settings``; docs/audit.md describes each key.
"""

from __future__ import annotations

from typing import Annotated, Literal

import attrs

from ...plugin_settings import Count, Expect, Number, settings_class


@settings_class
@attrs.frozen
class AuditSettings:
    """The plugin's settings; the defaults are the values of an empty table."""

    path: Annotated[str, Expect("a file path", bool)] | None = None  # None: <state_dir>/audit.jsonl
    fsync: Literal["always", "interval", "never"] = "interval"
    fsync_every: Count = 1000
    fsync_interval_ms: Number = 100.0
    rotate_bytes: Count | None = None
    rotate_seconds: Number | None = None
    mode: Literal["fail_closed", "fail_open"] = "fail_closed"
    record_output: bool = False
    redact_patterns: bool = True
    otel: bool = False
    #: A secret reference (the host config's ``secrets``) holding the HMAC key of checkpoints.
    checkpoint_key_ref: Annotated[str, Expect("the name of a secret reference", bool)] | None = None
    checkpoint_every: Count = 1000
