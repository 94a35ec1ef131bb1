"""The root of every error the platform raises for an operator or a user to catch.

``except StreamPlatformError`` catches them all; each keeps the built-in base it had
(``ConfigError`` is a ``ValueError``, the runtime's errors ``RuntimeError``), so code that
caught those goes on working. Re-exported from ``streamplatform`` with the errors themselves
(docs/guarantees.md, "What an operator catches")."""

from __future__ import annotations


class StreamPlatformError(Exception):
    """Base of every streamplatform error."""
