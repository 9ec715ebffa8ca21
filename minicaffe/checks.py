"""The checks Caffe's CHECKs make on a layer's parameters, as errors that name the field.

Run by :func:`minicaffe.layer.create_layer` before a layer is built, so nonsense is refused where
it is written, not found later as a NaN loss or a blob that silently changed shape:

- **every float field** a layer sets (``loss_weight``, ``param { lr_mult decay_mult }``, fillers,
  ``*_param`` settings) must be a finite number: ``nan`` or ``inf`` is never a useful setting
  (Clip's ``min``/``max`` may be infinite);
- **shapes** a layer makes (Input, DummyData) have every dimension at least 1 and at most
  2**31 - 1 values in all (Caffe's limit);
- per type, what the layer's arithmetic needs: BatchNorm ``eps > 0`` and
  ``0 <= moving_average_fraction <= 1``, MVN ``eps >= 0``, InnerProduct ``num_output >= 1``,
  Data ``1 <= prefetch <= MAX_PREFETCH`` (each prefetched batch is held in memory).

A layer that reshapes a blob it computes in place (Pooling with ``top`` = ``bottom``) is refused
by :meth:`minicaffe.layer.Layer.setup`, which sees the shapes.
"""

import math

from .errors import LayerError
from .proto.schema import descriptor

#: the deepest prefetch queue a Data layer may ask for (Caffe's default is 4, minicaffe's 3)
MAX_PREFETCH = 64

#: Caffe's Blob::Reshape limit ("blob size exceeds INT_MAX")
MAX_BLOB_COUNT = 2**31 - 1

#: parameters larger than this in magnitude mean a run has diverged (trained float32 weights are
#: rarely above 100)
DIVERGED = 1e8

# float fields that may be infinite (but not NaN)
_MAY_BE_INFINITE = {("ClipParameter", "min"), ("ClipParameter", "max")}


def _walk_floats(msg, path):
    """Yield (path, value, message type, field name) of every float/double set in ``msg``."""
    desc = descriptor(msg.type_name)
    for name, value in msg.fields():
        field = desc.by_name[name]
        where = f"{path}.{name}" if path else name
        if field.kind == "message":
            if field.repeated:
                for i, sub in enumerate(value):
                    yield from _walk_floats(sub, f"{where}[{i}]")
            else:
                yield from _walk_floats(value, where)
        elif field.type in ("float", "double"):
            if field.repeated:
                for i, v in enumerate(value):
                    yield f"{where}[{i}]" if len(value) > 1 else where, float(v), msg.type_name, name
            else:
                yield where, float(value), msg.type_name, name


def _check_shape(shape_msg, where, error):
    for i, d in enumerate(shape_msg.dim):
        if d < 1:
            raise error(f"{where}: dim {i} is {d}; every dimension of a blob this layer makes must be at least 1")
    count = math.prod(shape_msg.dim)
    if count > MAX_BLOB_COUNT:
        raise error(f"{where}: {list(shape_msg.dim)} is {count} values; a blob holds at most {MAX_BLOB_COUNT}")


def check_layer_param(lp):
    """Raise LayerError if ``lp`` (a LayerParameter) asks for something that makes no sense."""

    def error(message):
        return LayerError(lp.name, lp.type, message)

    for where, value, owner, name in _walk_floats(lp, ""):
        if math.isnan(value) or (math.isinf(value) and (owner, name) not in _MAY_BE_INFINITE):
            raise error(f"{where} is {value}: it must be a finite number")
    if lp.type == "BatchNorm" and lp.has("batch_norm_param"):
        bn = lp.batch_norm_param
        if not bn.eps > 0:
            raise error(f"batch_norm_param.eps is {bn.eps}: it must be positive (it keeps 1/sqrt(var + eps) finite)")
        if not 0 <= bn.moving_average_fraction <= 1:
            raise error(
                f"batch_norm_param.moving_average_fraction is {bn.moving_average_fraction}: it must be in [0, 1]"
            )
    elif lp.type == "MVN" and lp.mvn_param.eps < 0:
        raise error(f"mvn_param.eps is {lp.mvn_param.eps}: it must be >= 0")
    elif lp.type == "InnerProduct" and lp.inner_product_param.num_output < 1:
        raise error(f"inner_product_param.num_output is {lp.inner_product_param.num_output}: it must be at least 1")
    elif lp.type == "Input":
        for i, shape in enumerate(lp.input_param.shape):
            _check_shape(shape, f"input_param.shape[{i}]", error)
    elif lp.type == "DummyData":
        for i, shape in enumerate(lp.dummy_data_param.shape):
            _check_shape(shape, f"dummy_data_param.shape[{i}]", error)
    elif lp.type == "Data" and lp.data_param.has("prefetch"):
        depth = lp.data_param.prefetch
        if not 1 <= depth <= MAX_PREFETCH:
            raise error(
                f"data_param.prefetch {depth}: the queue of ready batches must hold 1 to {MAX_PREFETCH} "
                f"(at most {MAX_PREFETCH}; each batch is held in memory; the default is 3)"
            )


def explain_nonfinite(net):
    """Why a loss is not finite, as far as ``net`` shows it: parameters that diverged, or the
    first blob (in layer order) that holds NaN/inf and the layer that made it."""
    xp = net.xp

    def finite(a):
        return bool(xp.isfinite(a).all())

    for name, blobs in net.params.items():
        bad = [i for i, b in enumerate(blobs) if not finite(b.dev_data)]
        if bad:
            return (
                f"training diverged: parameter blob(s) {bad} of layer '{name}' hold NaN/inf "
                f"(try a smaller base_lr, or clip_gradients)"
            )
    largest = max(
        (float(xp.abs(b.dev_data).max()) for blobs in net.params.values() for b in blobs if b.count), default=0.0
    )
    for lname, tops in net.top_names.items():
        for top in tops:
            if top in net.blobs and not finite(net.blobs[top].dev_data):
                layer = net.layer_dict[lname]
                what = "the input data" if not net.bottom_names.get(lname) else f"blob '{top}'"
                where = f"{what} made by layer '{lname}' (type {layer.type}) holds NaN/inf"
                if largest > DIVERGED:
                    return (
                        f"training diverged: the parameters have grown to |w| = {largest:.3g} and {where} "
                        f"(try a smaller base_lr, or clip_gradients)"
                    )
                return f"the parameters are finite, but {where}: check that layer's inputs and settings"
    return (
        "the parameters and this net's blobs are finite: the NaN/inf came from a computation they do "
        "not show (a worker replica's batch, or a loss layer's arithmetic)"
    )
