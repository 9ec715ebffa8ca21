"""The errors minicaffe raises at its users.

Every error a user can cause (a malformed prototxt, an unknown layer type, a bottom that nothing
produces, shapes that do not fit) is one of these, and its message says *what* is wrong and
*where* (file:line:column, layer name and type, the shapes involved).  A numpy broadcasting error
or a numba typing error reaching a user is a bug in minicaffe.
"""

import difflib


class MinicaffeError(Exception):
    """Base class of every error minicaffe raises on purpose."""


class PrototxtError(MinicaffeError):
    """A prototxt (text format) or caffemodel (wire format) that cannot be read.

    ``filename``, ``line`` and ``column`` (1-based) say where, when known.
    """

    def __init__(self, message, filename=None, line=None, column=None):
        self.filename, self.line, self.column = filename, line, column
        where = filename or "<string>"
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}")
        self.bare_message = message


class LayerError(MinicaffeError):
    """A layer that cannot be built or run: names the layer, its type and the problem."""

    def __init__(self, layer_name, layer_type, message):
        self.layer_name, self.layer_type = layer_name, layer_type
        super().__init__(f"layer '{layer_name}' (type {layer_type}): {message}")


class NetError(MinicaffeError):
    """A net whose graph is wrong (a bottom nothing produces, a duplicate top, ...)."""


class SolverError(MinicaffeError):
    """A solver definition or state that cannot be used."""


class WeightsError(MinicaffeError):
    """A weights file (.caffemodel / .npz) that does not fit the net or cannot be read."""


def did_you_mean(word, choices, what="choices"):
    """A suffix for error messages: ' (did you mean 'x'?) Known ...: a, b, c'."""
    choices = sorted(set(choices))
    close = difflib.get_close_matches(word, choices, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{hint} Known {what}: {', '.join(choices)}"
