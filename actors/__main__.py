"""`python -m actors`."""

import sys

from actors.cli import main

if __name__ == "__main__":
    sys.exit(main())
