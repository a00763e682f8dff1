"""``kresilient``: a PySpark data source that writes DataFrames to Kafka without losing rows.

The full description is the docstring of :mod:`kresilient.spark._source`; this package
re-exports its public names.
"""

from __future__ import annotations

from kresilient.spark._source import *  # noqa: F403
from kresilient.spark._source import __all__ as __all__
