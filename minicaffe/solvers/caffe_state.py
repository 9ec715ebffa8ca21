"""Caffe's own ``.solverstate``: read one Caffe wrote, write one Caffe can resume from.

caffe.proto::

    message SolverState {
      optional int32 iter = 1;            // the iteration the snapshot was taken at
      optional string learned_net = 2;    // the .caffemodel written beside it (path as Caffe named it)
      repeated BlobProto history = 3;     // the update rule's history, one blob per buffer
      optional int32 current_step = 4 [default = 0];  // multistep position
    }

``history`` holds every history buffer of every learnable parameter, buffer by buffer: SGD,
Nesterov, AdaGrad and RMSProp keep one per parameter (N blobs), AdaDelta (squared gradients, then
squared updates) and Adam (m, then v) two (2N blobs) -- exactly minicaffe's ``history_names``
order.  Caffe writes each blob with ``Blob::ToProto``: ``data`` (packed float32; ``double_data``
for a double net) then ``shape { dim }``, fields in number order, and the state's fields as
``iter, learned_net, history..., current_step``.  :func:`encode_state` writes those same bytes.

Resuming from a Caffe state (:func:`restore`) does what Caffe's ``Solver::Restore`` does: the
iteration, the multistep position, the weights from ``learned_net`` (looked for as written,
relative to the working directory as Caffe does, then beside the state file) and the history
blobs.  Caffe's state has no field for the RNG, the smoothed-loss window or the data readers'
positions, so a run resumed from one starts those afresh (as a resumed Caffe run does);
minicaffe's own ``.npz`` state keeps them and resumes bit for bit.

Which format a snapshot is written in: the solver's ``snapshot_format``.  Unset, minicaffe
writes its own state; ``snapshot_format: BINARYPROTO`` written out in the solver prototxt (Caffe's
default value, set explicitly) writes Caffe's SolverState.  ``HDF5`` is not written (Caffe's HDF5
snapshot also needs HDF5 weights, ``.caffemodel.h5``): the snapshot is minicaffe's own, with a
line in the log saying so.
Reading detects the format from the file's first bytes, and reads Caffe's HDF5 snapshots too
(``snapshot_format: HDF5``, what Caffe's cifar10_full solvers write): the ``.solverstate.h5``
(datasets ``iter``, ``learned_net``, ``current_step``, group ``history`` of datasets ``0..n-1``)
by :func:`read_h5_state`, its ``.caffemodel.h5`` weights (group ``data/<layer>/<blob index>``, as
``Net::ToHDF5`` writes them) by :func:`read_h5_weights`, which ``minicaffe.io`` calls.
"""

import math
import os

import numpy as np

from ..errors import MinicaffeError, SolverError

_ZIP_MAGIC = b"PK\x03\x04"  # an .npz (minicaffe's own state)
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def wants_caffe_format(param, log=None):
    """Whether snapshots are Caffe's SolverState (``snapshot_format: BINARYPROTO`` set explicitly).

    ``HDF5`` (Caffe's cifar10_full solvers ask for it) is not written: the snapshot is minicaffe's
    own, and ``log`` says so."""
    if not param.has("snapshot_format"):
        return False
    if param.snapshot_format == "HDF5":
        if log is not None:
            log(
                "snapshot_format HDF5 is not written by minicaffe (Caffe's .caffemodel.h5/.solverstate.h5): "
                "writing a binary .caffemodel and minicaffe's state; BINARYPROTO gives Caffe's SolverState"
            )
        return False
    return True


def is_caffe_state(path):
    """True when ``path`` is not minicaffe's own (.npz) state: then it is read as Caffe's."""
    with open(path, "rb") as f:
        head = f.read(8)
    return not head.startswith(_ZIP_MAGIC)


def _h5py(path):
    try:
        import h5py
    except ImportError:
        raise SolverError(
            f"{path}: Caffe's HDF5 snapshots need h5py: pip install h5py (or 'minicaffe[data]')"
        ) from None
    return h5py


def read_h5_state(path):
    """Caffe's HDF5 solver state (SnapshotSolverStateToHDF5) -> the dict of :func:`decode_state`."""
    h5py = _h5py(path)
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in ("iter", "history") if k not in f]
            if missing:
                raise SolverError(
                    f"{path}: not a Caffe HDF5 solver state (no {' or '.join(missing)}; it has {list(f)})"
                )
            history_group = f["history"]
            count = len(history_group)
            names = sorted(history_group.keys(), key=lambda k: int(k) if k.isdigit() else -1)
            if names != [str(i) for i in range(count)]:
                raise SolverError(f"{path}: history datasets {names}; expected 0..{count - 1}")
            learned = None
            if "learned_net" in f:
                learned = f["learned_net"][()]
                learned = (learned.decode("utf-8", "replace") if isinstance(learned, bytes) else str(learned)).rstrip(
                    "\0"
                )
            return {
                "iter": int(f["iter"][()]),
                "current_step": int(f["current_step"][()]) if "current_step" in f else 0,
                "learned_net": learned,
                "history": [np.asarray(history_group[str(i)][...]) for i in range(count)],
            }
    except OSError as e:
        raise SolverError(f"{path}: cannot read the HDF5 solver state ({e})") from None


def read_h5_weights(path):
    """Caffe's HDF5 weights (``.caffemodel.h5``, Net::ToHDF5): {layer name: [arrays]}, every layer
    of group ``data`` in file order, blobs ``0..k-1``.  Raises WeightsError naming what is wrong."""
    from ..errors import WeightsError

    try:
        import h5py
    except ImportError:
        raise WeightsError(f"{path}: HDF5 weights need h5py: pip install h5py (or 'minicaffe[data]')") from None
    out = {}
    try:
        with h5py.File(path, "r") as f:
            if not isinstance(f.get("data"), h5py.Group):
                raise WeightsError(f"{path}: not Caffe's HDF5 weights (no group 'data'; it has {list(f)})")
            for lname, group in f["data"].items():
                if not isinstance(group, h5py.Group):
                    raise WeightsError(f"{path}: data/{lname} is not a group of blobs")
                keys = sorted(group.keys(), key=lambda k: int(k) if k.isdigit() else -1)
                if keys != [str(i) for i in range(len(keys))]:
                    raise WeightsError(f"{path}: layer '{lname}' has blobs {keys}; expected 0..{len(keys) - 1}")
                if keys:
                    out[lname] = [np.asarray(group[k][...]) for k in keys]
    except OSError as e:
        raise WeightsError(f"{path}: cannot read the HDF5 weights ({e})") from None
    return out


def is_complete_caffe_state(path):
    """Whether ``path`` holds a whole Caffe SolverState (decodes, has ``iter``): what a tool
    choosing a snapshot to resume from asks of a file that is not minicaffe's own state."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if not data or data.startswith(_ZIP_MAGIC):
            return False
        if data.startswith(_HDF5_MAGIC):
            read_h5_state(path)
            return True
        from .. import proto

        return proto.decode(data, "SolverState").has("iter")
    except (OSError, MinicaffeError):
        return False


def encode_state(iteration, current_step, learned_net, history):
    """The bytes of a SolverState: ``history`` a list of arrays (float32 -> data, float64 ->
    double_data), in Caffe's layout."""
    from .. import proto

    state = proto.Message("SolverState")
    state.iter = int(iteration)
    if learned_net is not None:
        state.learned_net = str(learned_net)
    for h in history:
        h = np.asarray(h)
        blob = state.add("history")
        if h.dtype == np.float64:
            blob.double_data = h.ravel()
        else:
            blob.data = h.astype(np.float32).ravel()
        blob.get_or_create("shape").dim.extend(int(d) for d in h.shape)
    state.current_step = int(current_step)
    return proto.encode(state)


def decode_state(data, where="solverstate"):
    """-> {"iter", "current_step", "learned_net" (or None), "history": [arrays]}."""
    from .. import proto

    try:
        state = proto.decode(data, "SolverState", filename=where)
    except MinicaffeError as e:
        raise SolverError(f"{where}: not a Caffe SolverState ({e})") from None
    history = []
    for i, blob in enumerate(state.history):
        values = blob.double_data if len(blob.double_data) else blob.data
        if blob.has("shape"):
            shape = tuple(int(d) for d in blob.shape.dim)
        else:  # legacy 4-d blob
            shape = tuple(int(v) for v in (blob.num, blob.channels, blob.height, blob.width))
        if len(shape) > 32 or any(d < 0 for d in shape) or math.prod(shape) != len(values):
            raise SolverError(
                f"{where}: history blob {i} says shape {shape} but carries {len(values)} values: a corrupt state"
            )
        history.append(np.asarray(values).reshape(shape))
    for field in ("iter", "current_step"):
        if not 0 <= getattr(state, field) <= 2**31 - 1:
            raise SolverError(f"{where}: {field} is {getattr(state, field)}: a corrupt state")
    return {
        "iter": int(state.iter),
        "current_step": int(state.current_step),
        "learned_net": state.learned_net if state.has("learned_net") else None,
        "history": history,
    }


def _find_weights(learned_net, state_path):
    if os.path.exists(learned_net):
        return learned_net
    beside = os.path.join(os.path.dirname(os.path.abspath(state_path)), os.path.basename(learned_net))
    if os.path.exists(beside):
        return beside
    raise SolverError(
        f"{state_path}: its weights '{learned_net}' are not found (looked in the working directory, as Caffe "
        f"does, and beside the state file)"
    )


def restore(solver, path):
    """Continue ``solver`` from Caffe's SolverState at ``path`` (see the module docstring)."""
    with open(path, "rb") as f:
        data = f.read()
    state = read_h5_state(path) if data.startswith(_HDF5_MAGIC) else decode_state(data, path)
    params = solver.net.learnable_params
    want = len(solver.history_names) * len(params)
    if len(state["history"]) != want:
        raise SolverError(
            f"{path}: {len(state['history'])} history blobs, but a {solver.type} solver of net "
            f"'{solver.net.name}' keeps {want} ({len(solver.history_names)} per learnable blob x {len(params)}): "
            f"a state of another net or solver type"
        )
    for k, h in enumerate(state["history"]):
        target = solver.history[k // len(params)][k % len(params)]
        if h.size != target.size:
            raise SolverError(
                f"{path}: history blob {k} has shape {h.shape}, parameter {k % len(params)} of net "
                f"'{solver.net.name}' has {tuple(target.shape)}"
            )
    if state["learned_net"]:
        solver.net.copy_from(_find_weights(state["learned_net"], path))
    for k, h in enumerate(state["history"]):
        target = solver.history[k // len(params)][k % len(params)]
        target[...] = solver.net.backend.from_host(h.reshape(target.shape), target.dtype)
    solver.iter = state["iter"]
    solver.current_step = state["current_step"]
    solver.losses, solver.smoothed_loss = [], 0.0
    for net in solver.test_nets:
        net.share_with(solver.net)
    solver.log(f"Restored Caffe solver state from {path} at iteration {solver.iter}")


def save(solver, path, weights_path):
    """Write ``solver``'s state as Caffe's SolverState (``learned_net`` = the weights' path as given)."""
    from ..io import atomic_write

    history = [np.asarray(solver.net.backend.to_host(h)) for hist in solver.history for h in hist]
    data = encode_state(solver.iter, solver.current_step, weights_path, history)
    atomic_write(path, lambda f: f.write(data))
