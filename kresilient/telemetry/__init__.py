"""OpenTelemetry spans and metrics for Kafka clients, on the current messaging conventions.

The full description is the docstring of :mod:`kresilient.telemetry._telemetry`; this package
re-exports its public names.
"""

from __future__ import annotations

from kresilient.telemetry._telemetry import *  # noqa: F403
from kresilient.telemetry._telemetry import __all__ as __all__
