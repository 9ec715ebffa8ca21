"""Upgrading legacy Caffe definitions to the current form (Caffe's ``upgrade_proto.cpp``).

Caffe's format changed a few times, and model zoos still hold files in the old forms.  Caffe
upgrades them on load (``UpgradeNetAsNeeded``), and so do we, in the same order:

1. **Data transformation** (2014): ``scale``, ``mean_file``, ``crop_size`` and ``mirror`` used
   to live inside ``data_param`` / ``image_data_param`` / ``window_data_param`` of a V1 layer;
   they move into the layer's ``transform_param``.
2. **V1 -> V2 layers** (2015): ``layers { type: CONVOLUTION blobs_lr: 1 weight_decay: 1 }``
   (the ``V1LayerParameter`` message, whose type is an enum) becomes
   ``layer { type: "Convolution" param { lr_mult: 1 decay_mult: 1 } }`` (``LayerParameter``,
   whose type is a string).  ``param: "w"`` names, ``blob_share_mode``, ``loss_weight``,
   ``include``/``exclude``, the ``*_param`` sub-messages and the blobs (weights in a
   caffemodel) carry over.
3. **Input dimensions**: ``input: "data" input_dim: 1 input_dim: 3 input_dim: 227
   input_dim: 227`` (four numbers per input) becomes ``input_shape { dim: [1, 3, 227, 227] }``.
   (Caffe then turns ``input``/``input_shape`` into an Input layer; minicaffe's Net does that.)
4. **BatchNorm** layers that declare three ``param`` specs get ``lr_mult: 0 decay_mult: 0`` on
   each (their blobs are statistics, not learned weights).

Solvers: ``solver_type: NESTEROV`` (an enum) becomes ``type: "Nesterov"`` (a string).

The V0 format (``layers { layer { ... } }``, before 2014) is refused with an explanation.
"""

from minicaffe.errors import PrototxtError
from minicaffe.proto.message import Message

# V1LayerParameter.LayerType -> the type string of today's LayerParameter (UpgradeV1LayerType).
V1_LAYER_TYPES = {
    "NONE": "",
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution",
    "DATA": "Data",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}

# SolverParameter.SolverType -> SolverParameter.type (UpgradeSolverType).
SOLVER_TYPES = {
    "SGD": "SGD",
    "NESTEROV": "Nesterov",
    "ADAGRAD": "AdaGrad",
    "RMSPROP": "RMSProp",
    "ADADELTA": "AdaDelta",
    "ADAM": "Adam",
}

# V1 data layers whose parameters used to carry the transformation fields.
_DATA_PARAMS = {"DATA": "data_param", "IMAGE_DATA": "image_data_param", "WINDOW_DATA": "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def _error(msg, message, field=None):
    loc = message.loc(field) or message.loc() or (None, None, None)
    return PrototxtError(msg, *loc)


def upgrade_net(net_param):
    """A copy of NetParameter ``net_param`` in today's form (see the module docstring).
    A net already current comes back equal to the input."""
    net = net_param.copy()
    for v1 in net.layers:
        if v1.has("layer"):
            raise _error(
                "this net uses the V0 layer format (layers { layer { ... } }) from "
                "before 2014, which minicaffe does not read; convert it with Caffe's "
                "upgrade_net_proto_text tool",
                v1,
                "layer",
            )
    upgrade_data_transformation(net)
    if net.has("layers"):
        if net.has("layer"):
            raise _error(
                "the net mixes 'layer' (current format, type: \"Convolution\") and "
                "'layers' (V1 format, type: CONVOLUTION) fields; write every layer "
                "in one format (the current one: layer { ... })",
                net,
                "layers",
            )
        for v1 in net.layers:
            net.layer.append(upgrade_v1_layer(v1))
        net.clear("layers")
    upgrade_input_dim(net)
    upgrade_batch_norm(net)
    return net


def upgrade_data_transformation(net):
    """V1 data layers: scale/mean_file/crop_size/mirror -> transform_param (in place)."""
    for v1 in net.layers:
        param_name = _DATA_PARAMS.get(v1.type)
        if param_name is None or not v1.has(param_name):
            continue
        data_param = getattr(v1, param_name)
        for name in _TRANSFORM_FIELDS:
            if data_param.has(name):
                setattr(v1.get_or_create("transform_param"), name, getattr(data_param, name))
                data_param.clear(name)


def upgrade_v1_layer(v1):
    """The LayerParameter equivalent of V1LayerParameter ``v1`` (UpgradeV1LayerParameter)."""
    layer = Message("LayerParameter")
    layer._locs.update(v1._locs)  # errors about the layer still point into the file
    if v1.has("name"):
        layer.name = v1.name
    if v1.has("type"):
        layer.type = V1_LAYER_TYPES[v1.type]
    layer.bottom = list(v1.bottom)
    layer.top = list(v1.top)
    # (upgrade_net works on its own copy, so sub-messages move over without another copy.)
    layer.include = list(v1.include)
    layer.exclude = list(v1.exclude)
    layer.loss_weight = list(v1.loss_weight)
    layer.blobs = list(v1.blobs)

    # Per-parameter settings, spread over four parallel lists in V1, become one ParamSpec each.
    def param(i):
        while len(layer.param) <= i:
            layer.add("param")
        return layer.param[i]

    for i, name in enumerate(v1.param):
        param(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        param(i).share_mode = mode  # same value names: STRICT, PERMISSIVE
    for i, lr in enumerate(v1.blobs_lr):
        param(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        param(i).decay_mult = decay

    # The *_param sub-messages have the same names and types in both messages.
    for name, value in v1.fields():
        if name.endswith("_param"):
            setattr(layer, name, value)
    return layer


def upgrade_input_dim(net):
    """input_dim (4 per input) -> input_shape (in place)."""
    if not net.has("input_dim"):
        return
    if net.has("input_shape"):
        raise _error("the net gives both input_dim and input_shape; use input_shape only", net, "input_dim")
    dims, names = list(net.input_dim), list(net.input)
    if len(dims) != 4 * len(names):
        raise _error(
            f"the net has {len(names)} input(s) and {len(dims)} input_dim values; "
            "input_dim needs exactly four (num, channels, height, width) per input",
            net,
            "input_dim",
        )
    for i in range(len(names)):
        net.add("input_shape").dim = dims[4 * i : 4 * i + 4]
    net.clear("input_dim")


def upgrade_batch_norm(net):
    """BatchNorm layers with three param specs: lr_mult = decay_mult = 0 (in place)."""
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


def upgrade_solver(solver_param):
    """A copy of SolverParameter ``solver_param`` with the legacy ``solver_type`` enum
    replaced by the ``type`` string."""
    solver = solver_param.copy()
    if solver.has("solver_type"):
        if solver.has("type"):
            raise _error(
                'the solver gives both solver_type (the old enum) and type; use type only (e.g. type: "SGD")',
                solver,
                "solver_type",
            )
        solver.type = SOLVER_TYPES[solver.solver_type]
        solver.clear("solver_type")
    return solver
