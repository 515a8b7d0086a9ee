"""`python -m learner`."""

import sys

from learner.cli import main

if __name__ == "__main__":
    sys.exit(main())
