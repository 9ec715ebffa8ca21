"""``python -m minicaffe.time``: see minicaffe/tools/timing.py."""

import sys

from .tools.timing import main

if __name__ == "__main__":
    sys.exit(main())
