"""``python -m minicaffe.train``: see minicaffe/tools/train.py."""

from .teardown import exit_without_teardown
from .tools.train import main

if __name__ == "__main__":
    exit_without_teardown(main())  # sys.exit(main()) less LLVM's destructors (minicaffe/teardown.py)
