"""The package version, in one leaf every module may import (the root package re-exports it)."""

__version__ = "0.1.0"
