"""kresilient: Kafka clients that are hard to misuse and easy to trust.

The public API is re-exported here; submodules hold the details:

- :mod:`kresilient.errors`: error classification and the exception tree.
- :mod:`kresilient.testing`: a real 3-node KRaft Kafka cluster for tests and demos.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__",
]
