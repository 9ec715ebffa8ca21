"""pycaffe's NetSpec (``caffe/python/caffe/net_spec.py``): write a net as Python calls.

    import minicaffe as caffe
    from minicaffe import layers as L, params as P

    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=64, backend=P.Data.LMDB, source="mnist_train",
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.loss = L.SoftmaxWithLoss(n.conv1, n.label)
    open("net.prototxt", "w").write(str(n.to_proto()))

How a call becomes a layer, as in pycaffe: ``L.<Type>(*bottoms, **params)`` records a layer of
that type whose bottoms are the given tops; ``ntop=k`` gives it k tops (a tuple), ``in_place=True``
makes its top its bottom.  Each keyword goes to the layer's own ``<type>_param`` message when that
message has the field (``kernel_size`` -> ``convolution_param.kernel_size``), else to the
LayerParameter itself (``include``, ``param``, ``loss_weight``, ``name``...); a keyword ending in
``param`` is always a LayerParameter field.  dicts fill sub-messages, lists fill repeated fields,
a list of dicts adds one sub-message each.  Layers and tops are named after the NetSpec attributes
they are assigned to (``n.conv1``); the others get ``<Type><k>``.
"""

from collections import Counter, OrderedDict

from .proto import caffe_pb2
from .proto.schema import SCHEMA


def param_name_dict():
    """{layer type: its LayerParameter field prefix}: 'Convolution' -> 'convolution',
    'InnerProduct' -> 'inner_product' (from the schema, as pycaffe derives it from caffe_pb2)."""
    out = {}
    for field in SCHEMA["LayerParameter"].fields:
        if field.name.endswith("_param") and field.kind == "message" and field.type.endswith("Parameter"):
            out[field.type[: -len("Parameter")]] = field.name[: -len("_param")]
    return out


_param_names = param_name_dict()


def to_proto(*tops):
    """A NetParameter holding the layers that ``tops`` need (and only those)."""
    layers = OrderedDict()
    autonames = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


def assign_proto(proto, name, val):
    """Set field ``name`` of message ``proto`` from a Python value (dicts and lists included)."""
    is_repeated_field = hasattr(getattr(proto, name), "extend")
    if is_repeated_field and not isinstance(val, list):
        val = [val]
    if isinstance(val, list):
        if val and isinstance(val[0], dict):
            for item in val:
                proto_item = getattr(proto, name).add()
                for k, v in item.items():
                    assign_proto(proto_item, k, v)
        else:
            getattr(proto, name).extend(val)
    elif isinstance(val, dict):
        for k, v in val.items():
            assign_proto(getattr(proto, name), k, v)
    else:
        setattr(proto, name, val)


class Top:
    """One output of a layer in a NetSpec (what ``L.<Type>(...)`` returns)."""

    def __init__(self, fn, n):
        self.fn, self.n = fn, n

    def to_proto(self):
        return to_proto(self)

    def _update(self, params):
        self.fn._update(params)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)

    def __repr__(self):
        return f"<Top {self.n} of {self.fn.type_name}>"


class Function:
    """A layer in a NetSpec: its type, bottoms (Tops) and parameters."""

    def __init__(self, type_name, inputs, params):
        self.type_name = type_name
        for index, bottom in enumerate(inputs):
            if not isinstance(bottom, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is {type(bottom).__name__})")
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames):
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top, names, autonames):
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _update(self, params):
        self.params.update(params)

    def _to_proto(self, layers, names, autonames):
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for k, v in self.params.items():
            if k.endswith("param"):  # generic *_param fields go to the layer itself
                assign_proto(layer, k, v)
            else:
                try:
                    assign_proto(getattr(layer, _param_names[self.type_name] + "_param"), k, v)
                except (AttributeError, KeyError):
                    assign_proto(layer, k, v)
        layers[self] = layer


class NetSpec:
    """Tops assigned as attributes (``n.conv1 = L.Convolution(...)``) name their layers;
    ``to_proto()`` gives the NetParameter of every layer assigned, in assignment order."""

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top '{name}' (it has: {', '.join(self.tops) or 'none'})") from None

    def __setitem__(self, key, value):
        self.__setattr__(key, value)

    def __getitem__(self, item):
        return self.__getattr__(item)

    def __delitem__(self, name):
        del self.tops[name]

    def keys(self):
        return list(self.tops.keys())

    def vals(self):
        return list(self.tops.values())

    def to_proto(self):
        names = {v: k for k, v in self.tops.items()}
        autonames = Counter()
        layers = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """``L.<Type>(*bottoms, **params)``: a layer of any type (pycaffe's ``caffe.layers``)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops

        layer_fn.__name__ = name
        return layer_fn


class Parameters:
    """``P.Pooling.MAX``: the enum constants of ``caffe_pb2.<Name>Parameter`` (pycaffe's ``caffe.params``)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter", None)
        if message is None:
            raise AttributeError(f"params: caffe.proto has no message {name}Parameter")

        class Param:
            def __getattr__(self, param_name):
                return getattr(message, param_name)

        return Param()


layers = Layers()
params = Parameters()
