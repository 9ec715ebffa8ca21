"""``python -m minicaffe.draw_net``: see minicaffe/tools/draw_net.py."""

import sys

from .tools.draw_net import main

if __name__ == "__main__":
    sys.exit(main())
