"""A real Apache Kafka cluster on loopback, for tests and demos.

The full description is the docstring of :mod:`kresilient.testing._cluster`; this package
re-exports its public names.
"""

from __future__ import annotations

from kresilient.testing._cluster import *  # noqa: F403
from kresilient.testing._cluster import __all__ as __all__
