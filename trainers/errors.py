"""Exceptions of the measuring core.

DDPSweepError            base of every error ddpsweep raises on purpose
└── ConfigError          a configuration value is invalid (names the field and what is allowed)
"""

from __future__ import annotations

MAX_VALUE_CHARS = 120  # an error quotes at most this much of a value


class DDPSweepError(Exception):
    """Base class of ddpsweep's own errors."""


class ConfigError(DDPSweepError, ValueError):
    """A configuration field holds a value that is not allowed.

    `field` is the (dotted) name of the field, `allowed` says what would be accepted.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        shown = repr(value)
        shown = shown if len(shown) <= MAX_VALUE_CHARS else shown[:MAX_VALUE_CHARS] + "… (truncated)"
        super().__init__(f"{field}: got {shown}; allowed: {allowed}")
