"""Flat parameter vectors: every learnable blob of a net as a slice of one array.

With the parameters in one vector ``W`` and the gradients in one vector ``G``, a reduction over
workers is one ``dot`` and a broadcast is nothing at all (every replica's blobs are views of the
same ``W``).  Caffe's parallel.cpp does the same (``apply_buffers``: one contiguous buffer per
net for data and one for diffs).

Shared parameters (``param { name: "w" }`` in two layers) occupy one slice: the owner's; every
layer blob that shares it is attached to the same slice.
"""

import numpy as np


class ParamLayout:
    """Where each learnable parameter lives in the flat vectors of ``net``.

    ``offsets[i]``, ``counts[i]`` for ``net.learnable_params[i]``; ``count`` = the total.
    """

    def __init__(self, net):
        self.net = net
        self.offsets, self.counts = [], []
        off = 0
        for p in net.learnable_params:
            self.offsets.append(off)
            self.counts.append(p.count)
            off += p.count
        self.count = off
        # every layer blob -> the learnable index whose slice it uses (owners and sharers)
        self.blob_slots = []
        k, owner_index = 0, 0
        for layer in net.layers:
            for b in layer.blobs:
                owner = net.params_owner[k]
                if owner is None:
                    owner, owner_index = owner_index, owner_index + 1
                self.blob_slots.append((b, owner))
                k += 1

    def slice(self, flat, i):
        return flat[self.offsets[i] : self.offsets[i] + self.counts[i]]

    def gather_data(self, out=None):
        """The current parameter values as one flat vector."""
        out = np.empty(self.count, self.net.dtype) if out is None else out
        for i, p in enumerate(self.net.learnable_params):
            self.slice(out, i)[...] = p.dev_flat_data
        return out

    def attach_data(self, flat, copy=True):
        """Make ``flat`` the parameters' storage (copying the current values in first)."""
        if copy:
            self.gather_data(out=flat)
        for b, i in self.blob_slots:
            b.attach(self.slice(flat, i), b.diff_storage)

    def attach_diff(self, flat):
        """Make ``flat`` the gradients' storage (zeroed)."""
        flat[...] = 0
        for b, i in self.blob_slots:
            b.attach(b.data_storage, self.slice(flat, i))


def attach_history(layout, hist, flat):
    """Make ``flat`` the storage of one history buffer list ``hist`` (one array per learnable
    parameter, laid out as ``layout``), copying the values in: ``hist[i]`` becomes a view."""
    for i, arr in enumerate(hist):
        view = layout.slice(flat, i).reshape(arr.shape)
        view[...] = arr
        hist[i] = view
