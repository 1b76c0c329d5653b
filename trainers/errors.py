"""The root of ddpsweep's one error tree, and the measuring core's own errors.

This module imports nothing of the project (nor torch), so results and the service may name these types
(results.errors.ResultsError derives from DDPSweepError). Each class carries `http_status`, the status the HTTP
API answers with (datasette's style): the edge reads it, it never tests classes one by one.

DDPSweepError                    500  base of every error ddpsweep raises on purpose
├── ConfigError                  422  a configuration value is invalid (names the field and what is allowed)
│   └── sweeps.spec.sweep.SpecError    422  a sweep spec field or command-line option is invalid
├── trainers.collectives.CalibrationError   500  an all-reduce returned a wrong sum
├── StepError                    500  a cell's step cannot be measured as set (kept recompiling, ran no collective)
├── ClusterUnreachable           503  the Ray cluster at an address could not be joined (refused, auth, version)
├── service.jobs.JobsError       503  Ray Jobs unreachable or refusing (SweepNotFound: 404)
└── results.errors.ResultsError  400  the store and its queries (its own tree: results.errors)
"""

from __future__ import annotations

MAX_VALUE_CHARS = 120  # an error quotes at most this much of a value


class DDPSweepError(Exception):
    """Base class of ddpsweep's own errors."""

    http_status: int = 500


class ConfigError(DDPSweepError, ValueError):
    """A configuration field holds a value that is not allowed.

    `field` is the (dotted) name of the field, `allowed` says what would be accepted.
    """

    http_status = 422

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        shown = repr(value)
        shown = shown if len(shown) <= MAX_VALUE_CHARS else shown[:MAX_VALUE_CHARS] + "… (truncated)"
        super().__init__(f"{field}: got {shown}; allowed: {allowed}")


class StepError(DDPSweepError):
    """A cell's step cannot be measured as configured: a compiled step that never stopped recompiling, or a
    distributed step that ran no all-reduce (its gradients were never synchronized). The cell's row is an error
    row; the worker group goes on."""


class ClusterUnreachable(DDPSweepError):
    """The Ray cluster named by --address or RAY_ADDRESS could not be joined; the message names it and why."""

    http_status = 503


ALLOW_WORKLOAD_ENV = "DDPSWEEP_ALLOW_WORKLOAD"
"""Comma-separated modules of the standard library or an installed distribution whose workload factories may run
(`ddpsweep run --allow-workload`); any other such module is refused (ConfigError on `workload`) before import."""
