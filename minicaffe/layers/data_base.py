"""DataLayer: the base of layers that read batches from outside the net (Caffe's BaseDataLayer).

A data layer has no bottoms; each forward puts the next batch into its tops.  What the solver
and the runtimes need of it is declared here, so they find data layers with
``isinstance(layer, DataLayer)`` and never reach into a reader::

    batch_size              images per batch (set by layer_setup)
    next_batch()            the next batch as host arrays, one per top (forward copies them in);
                            advances the position
    batch_copied()          forward has copied that batch into the tops: a layer that reads
                            ahead (a prefetch thread) may start on the next one now
    position()              where the reader is now, as plain JSON
    seek(state)             continue from a position()
    state_dict()            what a snapshot records: position(), unless a runtime declared
                            another source with set_position_source
    load_state_dict(state)  seek(state) (what a resume calls)

``set_position_source(fn)``: a runtime that reads batches ahead of the solver (the threaded
runtime fetches global batches for its workers) declares ``fn(layer) -> state`` so that a
snapshot records the position of the next batch the *solver* will use, not the reader's;
``set_position_source(None)`` restores ``position()``.

A subclass implements ``next_batch``, ``position`` and ``seek`` (and ``layer_setup`` /
``reshape`` as any layer); the default ``forward`` copies ``next_batch()`` into the tops.
"""

from ..layer import Layer


class DataLayer(Layer):
    min_bottom, max_bottom = 0, 0
    batch_size = None
    _position_source = None

    # -- what a subclass implements ------------------------------------------------------------
    def next_batch(self):
        """The next batch: a tuple of host arrays, one per top, each with the top's shape
        (or one reshapable to it).  Advances the position."""
        raise NotImplementedError(f"{type(self).__name__}.next_batch")

    def position(self):
        """The position of the next batch, as plain JSON."""
        raise NotImplementedError(f"{type(self).__name__}.position")

    def seek(self, state):
        """Make the next batch the one that came next when ``state`` was taken."""
        raise NotImplementedError(f"{type(self).__name__}.seek")

    # -- the contract the solver and runtimes use ----------------------------------------------
    def batch_copied(self):
        """Called by ``forward`` once the batch ``next_batch()`` gave is in the tops (nothing
        by default; the Data layer lets its prefetch thread make the next batch only then)."""

    def forward(self, bottom, top):
        batch = self.next_batch()
        for t, arr in zip(top, batch):
            # one counted host->device copy per top on a GPU backend; a plain copy on the CPU
            t.data = arr.reshape(t.shape)  # overwrites the host side; one copy to the device when next read
        self.batch_copied()

    def state_dict(self):
        """The position a snapshot records (see set_position_source)."""
        if self._position_source is not None:
            return self._position_source(self)
        return self.position()

    def load_state_dict(self, state):
        self.seek(state)

    def set_position_source(self, fn):
        """``fn(layer) -> state``: what ``state_dict`` returns from now on; None: ``position()``."""
        if fn is not None and not callable(fn):
            raise self.error(f"set_position_source: expected a function of the layer, got {type(fn).__name__}")
        self._position_source = fn

    def stop(self):
        """Release what the layer holds outside the net (a prefetch thread); nothing by default."""
