"""``python -m kresilient.lint PATH...`` (same as ``kresilient lint``)."""

import sys

from kresilient.lint.cli import main

sys.exit(main())
