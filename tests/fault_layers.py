"""A Python layer that misbehaves on request, for the fault tests of the threaded runtime.

It lives in its own module so that the test and the net's ``python_param`` import the same one.
"""

import threading

import numpy as np

# What the Gate layer does in worker thread 1 at its ``at``-th forward: "hang" (wait until
# released) or "nan" (poison its output).  Other threads pass data through.
GATE = {"mode": None, "at": 3, "release": threading.Event(), "calls": {}}


class Gate:
    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        name = threading.current_thread().name
        n = GATE["calls"][name] = GATE["calls"].get(name, 0) + 1
        top[0].data[...] = bottom[0].data
        if name == "minicaffe-worker-1" and n == GATE["at"]:
            if GATE["mode"] == "hang":
                GATE["release"].wait(60)
            elif GATE["mode"] == "nan":
                top[0].data[0, 0] = np.nan

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = top[0].diff
