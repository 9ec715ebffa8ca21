"""Reading batches: the order of the images, epochs, and the prefetch thread.

**Order.** A reader walks through the data set one epoch after another, ``batch_size`` images at
a time; a batch that runs past the end of an epoch continues at the start of the next (as
Caffe's Data layer wraps around its LMDB cursor).  With ``shuffle`` each epoch visits the images
in a fresh random order; without, in file order (Caffe's behaviour: it reads the LMDB
sequentially).  The Data layer reads a database in key order at every phase; a named dataset it
shuffles at TRAIN and reads in order at TEST (by default).

**Determinism.** Every random number is a pure function of the reader's ``seed`` and the position:
the order of epoch ``e`` comes from ``default_rng([seed, 0, e])``, the random crops and flips of
the batch starting at (epoch ``e``, index ``i``) from ``default_rng([seed, 1, e, i])``.  So
batch ``k`` is the same whatever thread made it and whenever, and the whole state of a reader is
three integers plus its settings: :meth:`Prefetcher.state_dict` returns them as plain JSON
(``{"epoch", "index", "seed", "shuffle", "size"}``), and :meth:`Prefetcher.load_state_dict`
makes the next batch the one that would have come next when the state was saved.

**Prefetch.** As in Caffe (BasePrefetchingDataLayer), a background thread makes the next
batches (gather + transform) while the net runs, at most ``depth`` batches ahead of the caller
(default 3).  The thread is a daemon, :meth:`Prefetcher.stop` ends it (and every live prefetcher
is stopped at interpreter exit), and an error in the thread is raised in the caller at the batch
where it happened.  ``depth=0`` makes batches synchronously in the caller, without a thread.

**When the thread wakes.** Caffe's prefetcher keeps two queues, full batches and free ones, and
the layer hands the batch it took back to the free queue only when it is done with it.  Here the
free queue is a count of free places (a semaphore of ``depth``; the batch the caller holds fills
one): :meth:`Prefetcher.next` takes a place's batch, and the thread may make another one once the
caller has *released* it (:meth:`Prefetcher.release`, or the next ``next()``).  The Data layer releases the batch after
copying it into its tops.  This matters with Python threads: a woken thread takes the GIL the
moment the caller lets it go, and copying a batch lets it go.  When ``next()`` itself woke the
thread (a plain bounded queue's ``get``), the copy of LeNet's 200 KB batch into its top took
0.14-0.17 ms inside a two-lane step, waiting for the prefetch thread's Python, against 0.035 ms
with no thread awake (``benchmarks/step_timeline.py``), all of it on the calling thread while
the other core waited.
"""

import atexit
import queue
import threading
import weakref

import numpy as np

from ._util import DatasetError

#: read and transform a batch in one compiled call where the transform allows it (BatchReader.fused);
#: False: the read, then the Transformer's numpy passes (the same bits)
FUSED_READS = True


class BatchReader:
    """The batch at a position of ``dataset``: a pure function of (epoch, index) and the seed."""

    def __init__(self, dataset, batch_size, transformer=None, shuffle=True, seed=0, dtype=np.float32):
        if batch_size < 1:
            raise DatasetError(f"batch_size must be positive, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.transformer = transformer
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.dtype = np.dtype(dtype)
        self._orders = {}
        #: (mean, scale) when the dataset reads and transforms a batch in one compiled call
        #: (a per-channel affine transform of bytes: MNIST's ``scale: 0.00390625``), else None
        self.fused = None
        if FUSED_READS and transformer is not None and getattr(dataset, "can_gather_affine", lambda: False)():
            self.fused = transformer.affine(dataset.shape[0])

    @property
    def size(self):
        return len(self.dataset)

    def order(self, epoch):
        """The image indices of ``epoch``, in the order they are read."""
        if not self.shuffle:
            return np.arange(self.size)
        if epoch not in self._orders:
            if len(self._orders) > 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = np.random.default_rng([self.seed, 0, epoch]).permutation(self.size)
        return self._orders[epoch]

    def indices(self, epoch, index):
        """The image indices of the batch starting at (epoch, index), and the position after it."""
        parts, need = [], self.batch_size
        while need:
            take = self.order(epoch)[index : index + need]
            parts.append(take)
            need -= len(take)
            index += len(take)
            if index >= self.size:
                epoch, index = epoch + 1, 0
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)), (epoch, index)

    def produce(self, epoch, index):
        """-> (data (B, C, h, w) of ``dtype``, labels (B,) of ``dtype`` or None, next position)."""
        idx, after = self.indices(epoch, index)
        if self.fused is not None:  # (the transformer's dtype: Transformer.affine)
            data, labels = self.dataset.gather_affine(idx, *self.fused)
            return data, None if labels is None else labels.astype(self.dtype), after
        images, labels = self.dataset.gather(idx)
        if self.transformer is not None:
            rng = np.random.default_rng([self.seed, 1, epoch, index]) if self.transformer.random else None
            if isinstance(images, list):  # records of different sizes: one at a time
                data = _stack_same([self.transformer(im[None], rng)[0] for im in images], self.dataset.name)
            else:
                data = self.transformer(images, rng)
        else:
            data = _stack_same(images, self.dataset.name).astype(self.dtype)
        labels = None if labels is None else labels.astype(self.dtype)
        return data, labels, after


def _stack_same(images, name):
    """One (N, C, H, W) array from a list of (C, H, W) (or an array as it is); a clear error when
    the images are of different sizes (without crop_size every image must be of one size)."""
    if not isinstance(images, list):
        return images
    shapes = sorted({im.shape for im in images})
    if len(shapes) > 1:
        raise DatasetError(
            f"'{name}': one batch holds images of shapes {', '.join(map(str, shapes))}; a batch is one "
            f"array, so every image must be of one size after the transform (set crop_size, or resize "
            f"the images when converting them)"
        )
    return np.stack(images)


class _Failed:
    def __init__(self, error):
        self.error = error


_live = weakref.WeakSet()


@atexit.register
def _stop_all():
    for p in list(_live):
        p.stop()


class Prefetcher:
    """Batches of a :class:`BatchReader`, made ``depth`` ahead by a background thread."""

    def __init__(self, reader, depth=3, epoch=0, index=0):
        self.reader = reader
        self.depth = int(depth)
        self._pos = (int(epoch), int(index))  # the position of the next batch the caller gets
        self._thread = None
        self._stop = None
        self._queue = None  # batches made, in order
        self._free = None  # a semaphore: places for the thread to make batches into
        self._held = False  # the caller holds the batch of a place (released by release())
        _live.add(self)

    # -- the caller's side ---------------------------------------------------------------------
    def next(self):
        """The next batch: (data, labels)."""
        if self.depth <= 0:
            data, labels, after = self.reader.produce(*self._pos)
        else:
            if self._thread is None:
                self.start()
            self.release()  # the caller is done with the batch before (if it did not say so)
            item = self._queue.get()
            if isinstance(item, _Failed):
                self._thread = None
                raise item.error
            self._held = True
            data, labels, after = item
        self._pos = after
        return data, labels

    def release(self):
        """The caller is done with the last batch ``next()`` gave (it has copied it): the thread
        may make the next one into its place now, not before (see "When the thread wakes").  The
        arrays stay valid: each batch is a fresh array.  Calling it twice is harmless."""
        if self._held:
            self._held = False
            self._free.release()

    def state_dict(self):
        """Where the reader is, as plain JSON: the next batch starts at (epoch, index)."""
        epoch, index = self._pos
        return {
            "epoch": int(epoch),
            "index": int(index),
            "seed": int(self.reader.seed),
            "shuffle": bool(self.reader.shuffle),
            "size": int(self.reader.size),
        }

    def load_state_dict(self, state):
        """Continue from a :meth:`state_dict`: the next batch is the one that came next then."""
        try:
            epoch, index, seed = int(state["epoch"]), int(state["index"]), int(state["seed"])
            shuffle, size = bool(state.get("shuffle", self.reader.shuffle)), int(state.get("size", self.reader.size))
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"not a data reader state: {state!r} ({e})") from None
        if size != self.reader.size:
            raise DatasetError(
                f"the saved data reader state is of a data set of {size} images, this one has "
                f"{self.reader.size}; was it saved with another dataset?"
            )
        if not (0 <= index < size and epoch >= 0):
            raise DatasetError(f"data reader state out of range: epoch {epoch}, index {index} of {size}")
        self.stop()
        self.reader.seed, self.reader.shuffle = seed, shuffle
        self.reader._orders.clear()
        self._pos = (epoch, index)

    # -- the thread ----------------------------------------------------------------------------
    def start(self):
        """Start the thread (``next`` does so when needed)."""
        if self.depth <= 0 or self._thread is not None:
            return
        self._stop = threading.Event()
        self._queue = queue.SimpleQueue()
        self._free = threading.Semaphore(self.depth)  # (as Caffe's PREFETCH_COUNT: the held one counts)
        self._held = False
        self._thread = threading.Thread(
            target=_produce_loop,
            args=(self.reader, self._pos, self._queue, self._free, self._stop),
            name="minicaffe-prefetch",
            daemon=True,
        )
        self._thread.start()

    def stop(self, timeout=5.0):
        """Stop the thread and drop the batches it had made ahead (the position is kept)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        self._free.release()  # wake a thread waiting for a free place
        self._held = False
        thread.join(timeout)

    def __del__(self):
        try:
            self.stop(timeout=0.5)
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


def _produce_loop(reader, pos, q, free, stop):
    """The thread's body: make batches from ``pos`` on, each into a free place (``free``), until
    ``stop`` is set.

    It holds no reference to the Prefetcher, so a Prefetcher nobody uses any more is collected
    (and its __del__ stops this thread).
    """
    while not stop.is_set():
        if not free.acquire(timeout=0.1):
            continue
        if stop.is_set():
            return
        try:
            item = reader.produce(*pos)
        except BaseException as e:  # noqa: BLE001  (handed to the caller)
            item = _Failed(e)
        q.put(item)
        if isinstance(item, _Failed):
            return
        pos = item[2]
