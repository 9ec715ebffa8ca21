"""Command-line tools, thin layers over the library: ``python -m minicaffe.train | test | time``."""
