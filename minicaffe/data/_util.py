"""Small helpers shared by the dataset modules: the cache directory, hashing, atomic writes,
and the progress display.

The cache directory, first that applies:

1. the ``cache_dir=`` argument (the ``--data-dir`` flag of the command-line tools),
2. :func:`minicaffe.data.set_data_dir` (what the tools call with their flag),
3. the environment variable ``MINICAFFE_DATA``,
4. ``$XDG_CACHE_HOME/minicaffe`` when ``XDG_CACHE_HOME`` is set,
5. ``~/.cache/minicaffe``.
"""

import hashlib
import os
import sys
from pathlib import Path

from ..errors import MinicaffeError


class DatasetError(MinicaffeError):
    """A dataset that cannot be found, fetched, verified or read."""


_state = {"data_dir": None}


def set_data_dir(path):
    """Make ``path`` the default cache / data directory of this process (None: back to the env)."""
    _state["data_dir"] = None if path is None else str(path)


def data_dir(cache_dir=None):
    """The directory datasets are looked for and cached in (see the module docstring)."""
    for choice in (cache_dir, _state["data_dir"], os.environ.get("MINICAFFE_DATA") or None):
        if choice:
            return Path(choice).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "minicaffe"
    return Path.home() / ".cache" / "minicaffe"


def sha256_file(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def atomic_write(path, write):
    """Call ``write(fileobj)`` on a temporary file beside ``path``, then rename it over ``path``.

    A crash or an error half-way leaves the old ``path`` (or nothing) in place, never a torn file.
    The one writer of minicaffe (:func:`minicaffe.io.atomic_write`): a cache gets the same
    permissions as a snapshot or a log, those of any file the user creates (0666 & ~umask).
    """
    from ..io import atomic_write as _atomic_write

    path = Path(path)
    _atomic_write(path, write)


class Progress:
    """Progress for long fetches: one rewritten line on a terminal, plain lines otherwise.

    ``step(msg)`` starts a new stage; ``update(done, total)`` reports bytes inside a stage (on a
    terminal the line is redrawn; elsewhere a line is printed at most every 25%).
    ``Progress(quiet=True)`` prints nothing.
    """

    def __init__(self, stream=None, quiet=False, prefix="minicaffe.data: "):
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.prefix = prefix
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._msg = ""
        self._last_quarter = -1
        self._open_line = False
        self._last_text = None

    def _write(self, text):
        if not self.quiet:
            self.stream.write(text)
            self.stream.flush()

    def step(self, msg):
        self._end_line()
        self._msg = msg
        self._last_quarter = -1
        self._last_text = None
        if self.tty:
            self._write(f"\r{self.prefix}{msg}\x1b[K")
            self._open_line = True
        else:
            self._write(f"{self.prefix}{msg}\n")

    def update(self, done, total=None):
        if total:
            frac = min(max(done / total, 0.0), 1.0)
            text = f"{self._msg}: {done / 1e6:.1f} / {total / 1e6:.1f} MB ({100 * frac:3.0f}%)"
        else:
            frac, text = None, f"{self._msg}: {done / 1e6:.1f} MB"
        if text == self._last_text:
            return
        self._last_text = text
        if self.tty:
            width = 24
            bar = "" if frac is None else "[" + "#" * int(width * frac) + "." * (width - int(width * frac)) + "] "
            self._write(f"\r{self.prefix}{bar}{text}\x1b[K")
            self._open_line = True
        elif frac is not None and int(frac * 4) > self._last_quarter:
            self._last_quarter = int(frac * 4)
            self._write(f"{self.prefix}{text}\n")

    def done(self, msg=None):
        if msg:
            self.step(msg)
        self._end_line()

    def _end_line(self):
        if self._open_line:
            self._write("\n")
            self._open_line = False
