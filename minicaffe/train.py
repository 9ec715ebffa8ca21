"""``python -m minicaffe.train``: see minicaffe/tools/train.py."""

import sys

from .tools.train import main

if __name__ == "__main__":
    sys.exit(main())
