"""State a long-lived host keeps per secret registered at run time stays proportional to the
secrets, not to their count squared. Found by attack: every caller bringing its own token (a
``ToolContext`` secret resolver) added a value to the host's ``SecretSet``; each change compiled
the alternation of every form of every secret, and the ``re`` module kept each superseded pattern
in its cache (512 on 3.11): 400 secrets held 233 MB."""

from __future__ import annotations

import re

from amplifier_tools.redaction import PLACEHOLDER, SecretSet, redact


def _cached_patterns() -> list[str]:
    """The patterns ``re`` keeps compiled (``_cache``; 3.12+ also ``_cache2``)."""
    keys = [*getattr(re, "_cache", {}), *getattr(re, "_cache2", {})]
    return [key[1] for key in keys if isinstance(key, tuple) and len(key) > 1 and isinstance(key[1], str)]


def test_a_secret_set_that_grows_leaves_no_superseded_pattern_in_the_re_cache() -> None:
    secrets = SecretSet()
    for i in range(40):
        secrets.add(f"growth-token-{i:04d}-abcdefgh")
        assert redact({"out": f"x growth-token-{i:04d}-abcdefgh y"}, secrets=secrets, patterns=False) == \
            {"out": f"x {PLACEHOLDER} y"}
    assert [p for p in _cached_patterns() if "growth\\-token" in p or "growth-token" in p] == []
    # the matcher still finds every secret, the first one too
    assert redact("growth-token-0000-abcdefgh", secrets=secrets, patterns=False) == PLACEHOLDER
