"""``python -m minicaffe.test``: see minicaffe/tools/score.py."""

import sys

from .tools.score import main

if __name__ == "__main__":
    sys.exit(main())
