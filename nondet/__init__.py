"""nondet: find, explain and prove the fix for batch-variance nondeterminism in LLM inference.

Importing this package imports no torch; the heavy modules load on first use.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
