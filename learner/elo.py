"""`python -m learner.elo`: the earlier name of `python -m evaluation.elo`, kept as an alias.

The tool lives in ``evaluation/`` (it trains nothing, and evaluation sits above the learner in the import
order), so this command shim loads it by name at run time instead of importing it.
"""

import importlib
import sys

if __name__ == "__main__":
    sys.exit(importlib.import_module("evaluation.elo").main(prog="python -m learner.elo"))
