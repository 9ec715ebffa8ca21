"""Caffe's message definitions (``caffe.proto``), as a Python table.

Caffe describes every file it reads -- a net (``NetParameter``), a solver (``SolverParameter``),
trained weights (a binary ``NetParameter`` holding ``BlobProto`` blobs) -- with protocol buffer
*messages*.  A message is a list of fields, and each field has

* a **name** (used by the text format: ``num_output: 64``),
* a **number** (used by the binary wire format, which never stores names),
* a **type**: a scalar (``double float int32 int64 uint32 uint64 bool string bytes``), an enum
  (a set of named integers, e.g. ``PoolingParameter.PoolMethod`` = {MAX: 0, AVE: 1, ...}) or
  another message (``FillerParameter``),
* a **label**: ``optional`` (at most once), ``repeated`` (a list), ``repeated packed`` (a list
  stored in one length-delimited run on the wire) or ``required`` (read like optional here),
* a **default**: the value read when the field is not set -- caffe.proto's explicit
  ``[default = ...]``, else the proto2 zero default (0, 0.0, false, "", the enum's *first*
  listed value).

The tables below are transcribed from BVLC Caffe's ``src/caffe/proto/caffe.proto`` (master):
``ENUMS`` maps an enum's qualified name (``"Phase"`` at top level, ``"Outer.Inner"`` when nested
in a message) to its values, and ``MESSAGES`` maps a message name to rows
``(name, number, type, label[, explicit default])``.  The code at the bottom turns the rows into
descriptors (``SCHEMA["PoolingParameter"].field("pool").default == "MAX"``).
"""

from minicaffe.errors import did_you_mean

# fmt: off
# Enums: qualified name -> {value name: number}.  A field's default is the *first* value listed
# (HingeLossParameter.Norm starts at L1 = 1, not at 0).
ENUMS = {
    "FillerParameter.VarianceNorm": {"FAN_IN": 0, "FAN_OUT": 1, "AVERAGE": 2},
    "SolverParameter.SnapshotFormat": {"HDF5": 0, "BINARYPROTO": 1},
    "SolverParameter.SolverMode": {"CPU": 0, "GPU": 1},
    "SolverParameter.SolverType": {
        "SGD": 0, "NESTEROV": 1, "ADAGRAD": 2, "RMSPROP": 3, "ADADELTA": 4, "ADAM": 5,
    },
    "Phase": {"TRAIN": 0, "TEST": 1},
    "ParamSpec.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "LossParameter.NormalizationMode": {"FULL": 0, "VALID": 1, "BATCH_SIZE": 2, "NONE": 3},
    "ConvolutionParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "DataParameter.DB": {"LEVELDB": 0, "LMDB": 1},
    "EltwiseParameter.EltwiseOp": {"PROD": 0, "SUM": 1, "MAX": 2},
    "HingeLossParameter.Norm": {"L1": 1, "L2": 2},
    "LRNParameter.NormRegion": {"ACROSS_CHANNELS": 0, "WITHIN_CHANNEL": 1},
    "LRNParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "PoolingParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
    "PoolingParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "PoolingParameter.RoundMode": {"CEIL": 0, "FLOOR": 1},
    "ReductionParameter.ReductionOp": {"SUM": 1, "ASUM": 2, "SUMSQ": 3, "MEAN": 4},
    "ReLUParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "SigmoidParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "SoftmaxParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "TanHParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "SPPParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
    "SPPParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "V1LayerParameter.LayerType": {
        "NONE": 0, "ABSVAL": 35, "ACCURACY": 1, "ARGMAX": 30, "BNLL": 2, "CONCAT": 3,
        "CONTRASTIVE_LOSS": 37, "CONVOLUTION": 4, "DATA": 5, "DECONVOLUTION": 39, "DROPOUT": 6,
        "DUMMY_DATA": 32, "EUCLIDEAN_LOSS": 7, "ELTWISE": 25, "EXP": 38, "FLATTEN": 8,
        "HDF5_DATA": 9, "HDF5_OUTPUT": 10, "HINGE_LOSS": 28, "IM2COL": 11, "IMAGE_DATA": 12,
        "INFOGAIN_LOSS": 13, "INNER_PRODUCT": 14, "LRN": 15, "MEMORY_DATA": 29,
        "MULTINOMIAL_LOGISTIC_LOSS": 16, "MVN": 34, "POOLING": 17, "POWER": 26, "RELU": 18,
        "SIGMOID": 19, "SIGMOID_CROSS_ENTROPY_LOSS": 27, "SILENCE": 36, "SOFTMAX": 20,
        "SOFTMAX_LOSS": 21, "SPLIT": 22, "SLICE": 33, "TANH": 23, "WINDOW_DATA": 24,
        "THRESHOLD": 31,
    },
    "V1LayerParameter.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "V0LayerParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
}

# Messages: name -> [(field name, field number, type, label[, explicit default])], in
# caffe.proto's order.  ClipParameter's two fields are caffe.proto's only 'required' ones.
MESSAGES = {
    "BlobShape": [
        ("dim", 1, "int64", "repeated packed"),
    ],
    "BlobProto": [
        ("shape", 7, "BlobShape", "optional"),
        ("data", 5, "float", "repeated packed"),
        ("diff", 6, "float", "repeated packed"),
        ("double_data", 8, "double", "repeated packed"),
        ("double_diff", 9, "double", "repeated packed"),
        ("num", 1, "int32", "optional", 0),
        ("channels", 2, "int32", "optional", 0),
        ("height", 3, "int32", "optional", 0),
        ("width", 4, "int32", "optional", 0),
    ],
    "BlobProtoVector": [
        ("blobs", 1, "BlobProto", "repeated"),
    ],
    "Datum": [
        ("channels", 1, "int32", "optional"),
        ("height", 2, "int32", "optional"),
        ("width", 3, "int32", "optional"),
        ("data", 4, "bytes", "optional"),
        ("label", 5, "int32", "optional"),
        ("float_data", 6, "float", "repeated"),
        ("encoded", 7, "bool", "optional", False),
    ],
    "FillerParameter": [
        ("type", 1, "string", "optional", "constant"),
        ("value", 2, "float", "optional", 0.0),
        ("min", 3, "float", "optional", 0.0),
        ("max", 4, "float", "optional", 1.0),
        ("mean", 5, "float", "optional", 0.0),
        ("std", 6, "float", "optional", 1.0),
        ("sparse", 7, "int32", "optional", -1),
        ("variance_norm", 8, "FillerParameter.VarianceNorm", "optional", "FAN_IN"),
    ],
    "NetParameter": [
        ("name", 1, "string", "optional"),
        ("input", 3, "string", "repeated"),
        ("input_shape", 8, "BlobShape", "repeated"),
        ("input_dim", 4, "int32", "repeated"),
        ("force_backward", 5, "bool", "optional", False),
        ("state", 6, "NetState", "optional"),
        ("debug_info", 7, "bool", "optional", False),
        ("layer", 100, "LayerParameter", "repeated"),
        ("layers", 2, "V1LayerParameter", "repeated"),
    ],
    "SolverParameter": [
        ("net", 24, "string", "optional"),
        ("net_param", 25, "NetParameter", "optional"),
        ("train_net", 1, "string", "optional"),
        ("test_net", 2, "string", "repeated"),
        ("train_net_param", 21, "NetParameter", "optional"),
        ("test_net_param", 22, "NetParameter", "repeated"),
        ("train_state", 26, "NetState", "optional"),
        ("test_state", 27, "NetState", "repeated"),
        ("test_iter", 3, "int32", "repeated"),
        ("test_interval", 4, "int32", "optional", 0),
        ("test_compute_loss", 19, "bool", "optional", False),
        ("test_initialization", 32, "bool", "optional", True),
        ("base_lr", 5, "float", "optional"),
        ("display", 6, "int32", "optional"),
        ("average_loss", 33, "int32", "optional", 1),
        ("max_iter", 7, "int32", "optional"),
        ("iter_size", 36, "int32", "optional", 1),
        ("lr_policy", 8, "string", "optional"),
        ("gamma", 9, "float", "optional"),
        ("power", 10, "float", "optional"),
        ("momentum", 11, "float", "optional"),
        ("weight_decay", 12, "float", "optional"),
        ("regularization_type", 29, "string", "optional", "L2"),
        ("stepsize", 13, "int32", "optional"),
        ("stepvalue", 34, "int32", "repeated"),
        ("clip_gradients", 35, "float", "optional", -1.0),
        ("snapshot", 14, "int32", "optional", 0),
        ("snapshot_prefix", 15, "string", "optional"),
        ("snapshot_diff", 16, "bool", "optional", False),
        ("snapshot_format", 37, "SolverParameter.SnapshotFormat", "optional", "BINARYPROTO"),
        ("solver_mode", 17, "SolverParameter.SolverMode", "optional", "GPU"),
        ("device_id", 18, "int32", "optional", 0),
        ("random_seed", 20, "int64", "optional", -1),
        ("type", 40, "string", "optional", "SGD"),
        ("delta", 31, "float", "optional", 1e-08),
        ("momentum2", 39, "float", "optional", 0.999),
        ("rms_decay", 38, "float", "optional", 0.99),
        ("debug_info", 23, "bool", "optional", False),
        ("snapshot_after_train", 28, "bool", "optional", True),
        ("solver_type", 30, "SolverParameter.SolverType", "optional", "SGD"),
        ("layer_wise_reduce", 41, "bool", "optional", True),
        ("weights", 42, "string", "repeated"),
    ],
    "SolverState": [
        ("iter", 1, "int32", "optional"),
        ("learned_net", 2, "string", "optional"),
        ("history", 3, "BlobProto", "repeated"),
        ("current_step", 4, "int32", "optional", 0),
    ],
    "NetState": [
        ("phase", 1, "Phase", "optional", "TEST"),
        ("level", 2, "int32", "optional", 0),
        ("stage", 3, "string", "repeated"),
    ],
    "NetStateRule": [
        ("phase", 1, "Phase", "optional"),
        ("min_level", 2, "int32", "optional"),
        ("max_level", 3, "int32", "optional"),
        ("stage", 4, "string", "repeated"),
        ("not_stage", 5, "string", "repeated"),
    ],
    "ParamSpec": [
        ("name", 1, "string", "optional"),
        ("share_mode", 2, "ParamSpec.DimCheckMode", "optional"),
        ("lr_mult", 3, "float", "optional", 1.0),
        ("decay_mult", 4, "float", "optional", 1.0),
    ],
    "LayerParameter": [
        ("name", 1, "string", "optional"),
        ("type", 2, "string", "optional"),
        ("bottom", 3, "string", "repeated"),
        ("top", 4, "string", "repeated"),
        ("phase", 10, "Phase", "optional"),
        ("loss_weight", 5, "float", "repeated"),
        ("param", 6, "ParamSpec", "repeated"),
        ("blobs", 7, "BlobProto", "repeated"),
        ("propagate_down", 11, "bool", "repeated"),
        ("include", 8, "NetStateRule", "repeated"),
        ("exclude", 9, "NetStateRule", "repeated"),
        ("transform_param", 100, "TransformationParameter", "optional"),
        ("loss_param", 101, "LossParameter", "optional"),
        ("accuracy_param", 102, "AccuracyParameter", "optional"),
        ("argmax_param", 103, "ArgMaxParameter", "optional"),
        ("batch_norm_param", 139, "BatchNormParameter", "optional"),
        ("bias_param", 141, "BiasParameter", "optional"),
        ("clip_param", 148, "ClipParameter", "optional"),
        ("concat_param", 104, "ConcatParameter", "optional"),
        ("contrastive_loss_param", 105, "ContrastiveLossParameter", "optional"),
        ("convolution_param", 106, "ConvolutionParameter", "optional"),
        ("crop_param", 144, "CropParameter", "optional"),
        ("data_param", 107, "DataParameter", "optional"),
        ("dropout_param", 108, "DropoutParameter", "optional"),
        ("dummy_data_param", 109, "DummyDataParameter", "optional"),
        ("eltwise_param", 110, "EltwiseParameter", "optional"),
        ("elu_param", 140, "ELUParameter", "optional"),
        ("embed_param", 137, "EmbedParameter", "optional"),
        ("exp_param", 111, "ExpParameter", "optional"),
        ("flatten_param", 135, "FlattenParameter", "optional"),
        ("hdf5_data_param", 112, "HDF5DataParameter", "optional"),
        ("hdf5_output_param", 113, "HDF5OutputParameter", "optional"),
        ("hinge_loss_param", 114, "HingeLossParameter", "optional"),
        ("image_data_param", 115, "ImageDataParameter", "optional"),
        ("infogain_loss_param", 116, "InfogainLossParameter", "optional"),
        ("inner_product_param", 117, "InnerProductParameter", "optional"),
        ("input_param", 143, "InputParameter", "optional"),
        ("log_param", 134, "LogParameter", "optional"),
        ("lrn_param", 118, "LRNParameter", "optional"),
        ("memory_data_param", 119, "MemoryDataParameter", "optional"),
        ("mvn_param", 120, "MVNParameter", "optional"),
        ("parameter_param", 145, "ParameterParameter", "optional"),
        ("pooling_param", 121, "PoolingParameter", "optional"),
        ("power_param", 122, "PowerParameter", "optional"),
        ("prelu_param", 131, "PReLUParameter", "optional"),
        ("python_param", 130, "PythonParameter", "optional"),
        ("recurrent_param", 146, "RecurrentParameter", "optional"),
        ("reduction_param", 136, "ReductionParameter", "optional"),
        ("relu_param", 123, "ReLUParameter", "optional"),
        ("reshape_param", 133, "ReshapeParameter", "optional"),
        ("scale_param", 142, "ScaleParameter", "optional"),
        ("sigmoid_param", 124, "SigmoidParameter", "optional"),
        ("softmax_param", 125, "SoftmaxParameter", "optional"),
        ("spp_param", 132, "SPPParameter", "optional"),
        ("slice_param", 126, "SliceParameter", "optional"),
        ("swish_param", 147, "SwishParameter", "optional"),
        ("tanh_param", 127, "TanHParameter", "optional"),
        ("threshold_param", 128, "ThresholdParameter", "optional"),
        ("tile_param", 138, "TileParameter", "optional"),
        ("window_data_param", 129, "WindowDataParameter", "optional"),
    ],
    "TransformationParameter": [
        ("scale", 1, "float", "optional", 1.0),
        ("mirror", 2, "bool", "optional", False),
        ("crop_size", 3, "uint32", "optional", 0),
        ("mean_file", 4, "string", "optional"),
        ("mean_value", 5, "float", "repeated"),
        ("force_color", 6, "bool", "optional", False),
        ("force_gray", 7, "bool", "optional", False),
    ],
    "LossParameter": [
        ("ignore_label", 1, "int32", "optional"),
        ("normalization", 3, "LossParameter.NormalizationMode", "optional", "VALID"),
        ("normalize", 2, "bool", "optional"),
    ],
    "AccuracyParameter": [
        ("top_k", 1, "uint32", "optional", 1),
        ("axis", 2, "int32", "optional", 1),
        ("ignore_label", 3, "int32", "optional"),
    ],
    "ArgMaxParameter": [
        ("out_max_val", 1, "bool", "optional", False),
        ("top_k", 2, "uint32", "optional", 1),
        ("axis", 3, "int32", "optional"),
    ],
    "ClipParameter": [
        ("min", 1, "float", "required"),
        ("max", 2, "float", "required"),
    ],
    "ConcatParameter": [
        ("axis", 2, "int32", "optional", 1),
        ("concat_dim", 1, "uint32", "optional", 1),
    ],
    "BatchNormParameter": [
        ("use_global_stats", 1, "bool", "optional"),
        ("moving_average_fraction", 2, "float", "optional", 0.999),
        ("eps", 3, "float", "optional", 1e-05),
    ],
    "BiasParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("num_axes", 2, "int32", "optional", 1),
        ("filler", 3, "FillerParameter", "optional"),
    ],
    "ContrastiveLossParameter": [
        ("margin", 1, "float", "optional", 1.0),
        ("legacy_version", 2, "bool", "optional", False),
    ],
    "ConvolutionParameter": [
        ("num_output", 1, "uint32", "optional"),
        ("bias_term", 2, "bool", "optional", True),
        ("pad", 3, "uint32", "repeated"),
        ("kernel_size", 4, "uint32", "repeated"),
        ("stride", 6, "uint32", "repeated"),
        ("dilation", 18, "uint32", "repeated"),
        ("pad_h", 9, "uint32", "optional", 0),
        ("pad_w", 10, "uint32", "optional", 0),
        ("kernel_h", 11, "uint32", "optional"),
        ("kernel_w", 12, "uint32", "optional"),
        ("stride_h", 13, "uint32", "optional"),
        ("stride_w", 14, "uint32", "optional"),
        ("group", 5, "uint32", "optional", 1),
        ("weight_filler", 7, "FillerParameter", "optional"),
        ("bias_filler", 8, "FillerParameter", "optional"),
        ("engine", 15, "ConvolutionParameter.Engine", "optional", "DEFAULT"),
        ("axis", 16, "int32", "optional", 1),
        ("force_nd_im2col", 17, "bool", "optional", False),
    ],
    "CropParameter": [
        ("axis", 1, "int32", "optional", 2),
        ("offset", 2, "uint32", "repeated"),
    ],
    "DataParameter": [
        ("source", 1, "string", "optional"),
        ("batch_size", 4, "uint32", "optional"),
        ("rand_skip", 7, "uint32", "optional", 0),
        ("backend", 8, "DataParameter.DB", "optional", "LEVELDB"),
        ("scale", 2, "float", "optional", 1.0),
        ("mean_file", 3, "string", "optional"),
        ("crop_size", 5, "uint32", "optional", 0),
        ("mirror", 6, "bool", "optional", False),
        ("force_encoded_color", 9, "bool", "optional", False),
        ("prefetch", 10, "uint32", "optional", 4),
    ],
    "DropoutParameter": [
        ("dropout_ratio", 1, "float", "optional", 0.5),
    ],
    "DummyDataParameter": [
        ("data_filler", 1, "FillerParameter", "repeated"),
        ("shape", 6, "BlobShape", "repeated"),
        ("num", 2, "uint32", "repeated"),
        ("channels", 3, "uint32", "repeated"),
        ("height", 4, "uint32", "repeated"),
        ("width", 5, "uint32", "repeated"),
    ],
    "EltwiseParameter": [
        ("operation", 1, "EltwiseParameter.EltwiseOp", "optional", "SUM"),
        ("coeff", 2, "float", "repeated"),
        ("stable_prod_grad", 3, "bool", "optional", True),
    ],
    "ELUParameter": [
        ("alpha", 1, "float", "optional", 1.0),
    ],
    "EmbedParameter": [
        ("num_output", 1, "uint32", "optional"),
        ("input_dim", 2, "uint32", "optional"),
        ("bias_term", 3, "bool", "optional", True),
        ("weight_filler", 4, "FillerParameter", "optional"),
        ("bias_filler", 5, "FillerParameter", "optional"),
    ],
    "ExpParameter": [
        ("base", 1, "float", "optional", -1.0),
        ("scale", 2, "float", "optional", 1.0),
        ("shift", 3, "float", "optional", 0.0),
    ],
    "FlattenParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("end_axis", 2, "int32", "optional", -1),
    ],
    "HDF5DataParameter": [
        ("source", 1, "string", "optional"),
        ("batch_size", 2, "uint32", "optional"),
        ("shuffle", 3, "bool", "optional", False),
    ],
    "HDF5OutputParameter": [
        ("file_name", 1, "string", "optional"),
    ],
    "HingeLossParameter": [
        ("norm", 1, "HingeLossParameter.Norm", "optional", "L1"),
    ],
    "ImageDataParameter": [
        ("source", 1, "string", "optional"),
        ("batch_size", 4, "uint32", "optional", 1),
        ("rand_skip", 7, "uint32", "optional", 0),
        ("shuffle", 8, "bool", "optional", False),
        ("new_height", 9, "uint32", "optional", 0),
        ("new_width", 10, "uint32", "optional", 0),
        ("is_color", 11, "bool", "optional", True),
        ("scale", 2, "float", "optional", 1.0),
        ("mean_file", 3, "string", "optional"),
        ("crop_size", 5, "uint32", "optional", 0),
        ("mirror", 6, "bool", "optional", False),
        ("root_folder", 12, "string", "optional", ""),
    ],
    "InfogainLossParameter": [
        ("source", 1, "string", "optional"),
        ("axis", 2, "int32", "optional", 1),
    ],
    "InnerProductParameter": [
        ("num_output", 1, "uint32", "optional"),
        ("bias_term", 2, "bool", "optional", True),
        ("weight_filler", 3, "FillerParameter", "optional"),
        ("bias_filler", 4, "FillerParameter", "optional"),
        ("axis", 5, "int32", "optional", 1),
        ("transpose", 6, "bool", "optional", False),
    ],
    "InputParameter": [
        ("shape", 1, "BlobShape", "repeated"),
    ],
    "LogParameter": [
        ("base", 1, "float", "optional", -1.0),
        ("scale", 2, "float", "optional", 1.0),
        ("shift", 3, "float", "optional", 0.0),
    ],
    "LRNParameter": [
        ("local_size", 1, "uint32", "optional", 5),
        ("alpha", 2, "float", "optional", 1.0),
        ("beta", 3, "float", "optional", 0.75),
        ("norm_region", 4, "LRNParameter.NormRegion", "optional", "ACROSS_CHANNELS"),
        ("k", 5, "float", "optional", 1.0),
        ("engine", 6, "LRNParameter.Engine", "optional", "DEFAULT"),
    ],
    "MemoryDataParameter": [
        ("batch_size", 1, "uint32", "optional"),
        ("channels", 2, "uint32", "optional"),
        ("height", 3, "uint32", "optional"),
        ("width", 4, "uint32", "optional"),
    ],
    "MVNParameter": [
        ("normalize_variance", 1, "bool", "optional", True),
        ("across_channels", 2, "bool", "optional", False),
        ("eps", 3, "float", "optional", 1e-09),
    ],
    "ParameterParameter": [
        ("shape", 1, "BlobShape", "optional"),
    ],
    "PoolingParameter": [
        ("pool", 1, "PoolingParameter.PoolMethod", "optional", "MAX"),
        ("pad", 4, "uint32", "optional", 0),
        ("pad_h", 9, "uint32", "optional", 0),
        ("pad_w", 10, "uint32", "optional", 0),
        ("kernel_size", 2, "uint32", "optional"),
        ("kernel_h", 5, "uint32", "optional"),
        ("kernel_w", 6, "uint32", "optional"),
        ("stride", 3, "uint32", "optional", 1),
        ("stride_h", 7, "uint32", "optional"),
        ("stride_w", 8, "uint32", "optional"),
        ("engine", 11, "PoolingParameter.Engine", "optional", "DEFAULT"),
        ("global_pooling", 12, "bool", "optional", False),
        ("round_mode", 13, "PoolingParameter.RoundMode", "optional", "CEIL"),
    ],
    "PowerParameter": [
        ("power", 1, "float", "optional", 1.0),
        ("scale", 2, "float", "optional", 1.0),
        ("shift", 3, "float", "optional", 0.0),
    ],
    "PythonParameter": [
        ("module", 1, "string", "optional"),
        ("layer", 2, "string", "optional"),
        ("param_str", 3, "string", "optional", ""),
        ("share_in_parallel", 4, "bool", "optional", False),
    ],
    "RecurrentParameter": [
        ("num_output", 1, "uint32", "optional", 0),
        ("weight_filler", 2, "FillerParameter", "optional"),
        ("bias_filler", 3, "FillerParameter", "optional"),
        ("debug_info", 4, "bool", "optional", False),
        ("expose_hidden", 5, "bool", "optional", False),
    ],
    "ReductionParameter": [
        ("operation", 1, "ReductionParameter.ReductionOp", "optional", "SUM"),
        ("axis", 2, "int32", "optional", 0),
        ("coeff", 3, "float", "optional", 1.0),
    ],
    "ReLUParameter": [
        ("negative_slope", 1, "float", "optional", 0.0),
        ("engine", 2, "ReLUParameter.Engine", "optional", "DEFAULT"),
    ],
    "ReshapeParameter": [
        ("shape", 1, "BlobShape", "optional"),
        ("axis", 2, "int32", "optional", 0),
        ("num_axes", 3, "int32", "optional", -1),
    ],
    "ScaleParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("num_axes", 2, "int32", "optional", 1),
        ("filler", 3, "FillerParameter", "optional"),
        ("bias_term", 4, "bool", "optional", False),
        ("bias_filler", 5, "FillerParameter", "optional"),
    ],
    "SigmoidParameter": [
        ("engine", 1, "SigmoidParameter.Engine", "optional", "DEFAULT"),
    ],
    "SliceParameter": [
        ("axis", 3, "int32", "optional", 1),
        ("slice_point", 2, "uint32", "repeated"),
        ("slice_dim", 1, "uint32", "optional", 1),
    ],
    "SoftmaxParameter": [
        ("engine", 1, "SoftmaxParameter.Engine", "optional", "DEFAULT"),
        ("axis", 2, "int32", "optional", 1),
    ],
    "SwishParameter": [
        ("beta", 1, "float", "optional", 1.0),
    ],
    "TanHParameter": [
        ("engine", 1, "TanHParameter.Engine", "optional", "DEFAULT"),
    ],
    "TileParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("tiles", 2, "int32", "optional"),
    ],
    "ThresholdParameter": [
        ("threshold", 1, "float", "optional", 0.0),
    ],
    "WindowDataParameter": [
        ("source", 1, "string", "optional"),
        ("scale", 2, "float", "optional", 1.0),
        ("mean_file", 3, "string", "optional"),
        ("batch_size", 4, "uint32", "optional"),
        ("crop_size", 5, "uint32", "optional", 0),
        ("mirror", 6, "bool", "optional", False),
        ("fg_threshold", 7, "float", "optional", 0.5),
        ("bg_threshold", 8, "float", "optional", 0.5),
        ("fg_fraction", 9, "float", "optional", 0.25),
        ("context_pad", 10, "uint32", "optional", 0),
        ("crop_mode", 11, "string", "optional", "warp"),
        ("cache_images", 12, "bool", "optional", False),
        ("root_folder", 13, "string", "optional", ""),
    ],
    "SPPParameter": [
        ("pyramid_height", 1, "uint32", "optional"),
        ("pool", 2, "SPPParameter.PoolMethod", "optional", "MAX"),
        ("engine", 6, "SPPParameter.Engine", "optional", "DEFAULT"),
    ],
    "V1LayerParameter": [
        ("bottom", 2, "string", "repeated"),
        ("top", 3, "string", "repeated"),
        ("name", 4, "string", "optional"),
        ("include", 32, "NetStateRule", "repeated"),
        ("exclude", 33, "NetStateRule", "repeated"),
        ("type", 5, "V1LayerParameter.LayerType", "optional"),
        ("blobs", 6, "BlobProto", "repeated"),
        ("param", 1001, "string", "repeated"),
        ("blob_share_mode", 1002, "V1LayerParameter.DimCheckMode", "repeated"),
        ("blobs_lr", 7, "float", "repeated"),
        ("weight_decay", 8, "float", "repeated"),
        ("loss_weight", 35, "float", "repeated"),
        ("accuracy_param", 27, "AccuracyParameter", "optional"),
        ("argmax_param", 23, "ArgMaxParameter", "optional"),
        ("concat_param", 9, "ConcatParameter", "optional"),
        ("contrastive_loss_param", 40, "ContrastiveLossParameter", "optional"),
        ("convolution_param", 10, "ConvolutionParameter", "optional"),
        ("data_param", 11, "DataParameter", "optional"),
        ("dropout_param", 12, "DropoutParameter", "optional"),
        ("dummy_data_param", 26, "DummyDataParameter", "optional"),
        ("eltwise_param", 24, "EltwiseParameter", "optional"),
        ("exp_param", 41, "ExpParameter", "optional"),
        ("hdf5_data_param", 13, "HDF5DataParameter", "optional"),
        ("hdf5_output_param", 14, "HDF5OutputParameter", "optional"),
        ("hinge_loss_param", 29, "HingeLossParameter", "optional"),
        ("image_data_param", 15, "ImageDataParameter", "optional"),
        ("infogain_loss_param", 16, "InfogainLossParameter", "optional"),
        ("inner_product_param", 17, "InnerProductParameter", "optional"),
        ("lrn_param", 18, "LRNParameter", "optional"),
        ("memory_data_param", 22, "MemoryDataParameter", "optional"),
        ("mvn_param", 34, "MVNParameter", "optional"),
        ("pooling_param", 19, "PoolingParameter", "optional"),
        ("power_param", 21, "PowerParameter", "optional"),
        ("relu_param", 30, "ReLUParameter", "optional"),
        ("sigmoid_param", 38, "SigmoidParameter", "optional"),
        ("softmax_param", 39, "SoftmaxParameter", "optional"),
        ("slice_param", 31, "SliceParameter", "optional"),
        ("tanh_param", 37, "TanHParameter", "optional"),
        ("threshold_param", 25, "ThresholdParameter", "optional"),
        ("window_data_param", 20, "WindowDataParameter", "optional"),
        ("transform_param", 36, "TransformationParameter", "optional"),
        ("loss_param", 42, "LossParameter", "optional"),
        ("layer", 1, "V0LayerParameter", "optional"),
    ],
    "V0LayerParameter": [
        ("name", 1, "string", "optional"),
        ("type", 2, "string", "optional"),
        ("num_output", 3, "uint32", "optional"),
        ("biasterm", 4, "bool", "optional", True),
        ("weight_filler", 5, "FillerParameter", "optional"),
        ("bias_filler", 6, "FillerParameter", "optional"),
        ("pad", 7, "uint32", "optional", 0),
        ("kernelsize", 8, "uint32", "optional"),
        ("group", 9, "uint32", "optional", 1),
        ("stride", 10, "uint32", "optional", 1),
        ("pool", 11, "V0LayerParameter.PoolMethod", "optional", "MAX"),
        ("dropout_ratio", 12, "float", "optional", 0.5),
        ("local_size", 13, "uint32", "optional", 5),
        ("alpha", 14, "float", "optional", 1.0),
        ("beta", 15, "float", "optional", 0.75),
        ("k", 22, "float", "optional", 1.0),
        ("source", 16, "string", "optional"),
        ("scale", 17, "float", "optional", 1.0),
        ("meanfile", 18, "string", "optional"),
        ("batchsize", 19, "uint32", "optional"),
        ("cropsize", 20, "uint32", "optional", 0),
        ("mirror", 21, "bool", "optional", False),
        ("blobs", 50, "BlobProto", "repeated"),
        ("blobs_lr", 51, "float", "repeated"),
        ("weight_decay", 52, "float", "repeated"),
        ("rand_skip", 53, "uint32", "optional", 0),
        ("det_fg_threshold", 54, "float", "optional", 0.5),
        ("det_bg_threshold", 55, "float", "optional", 0.5),
        ("det_fg_fraction", 56, "float", "optional", 0.25),
        ("det_context_pad", 58, "uint32", "optional", 0),
        ("det_crop_mode", 59, "string", "optional", "warp"),
        ("new_num", 60, "int32", "optional", 0),
        ("new_channels", 61, "int32", "optional", 0),
        ("new_height", 62, "int32", "optional", 0),
        ("new_width", 63, "int32", "optional", 0),
        ("shuffle_images", 64, "bool", "optional", False),
        ("concat_dim", 65, "uint32", "optional", 1),
        ("hdf5_output_param", 1001, "HDF5OutputParameter", "optional"),
    ],
    "PReLUParameter": [
        ("filler", 1, "FillerParameter", "optional"),
        ("channel_shared", 2, "bool", "optional", False),
    ],
}


# fmt: on


def suggest(word, choices, what):
    """' (did you mean 'x'?) Known <what>: a, b, c' -- a '.' first when nothing is close."""
    hint = did_you_mean(word, choices, what)
    return hint if hint.startswith(" (") else "." + hint


SCALAR_TYPES = ("double", "float", "int32", "int64", "uint32", "uint64", "bool", "string", "bytes")

# The range each integer type can hold (checked when a value is set or parsed).
INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}

_ZERO = {
    "double": 0.0,
    "float": 0.0,
    "int32": 0,
    "int64": 0,
    "uint32": 0,
    "uint64": 0,
    "bool": False,
    "string": "",
    "bytes": b"",
}


class FieldDescriptor:
    """One field of a message: name, number, type, label, default.

    ``kind`` is ``"scalar"``, ``"enum"`` or ``"message"``; for an enum, ``enum_values`` maps
    value names to numbers (and ``enum_names`` numbers to names).
    """

    def __init__(self, message_name, name, number, type, label, default=None):
        self.message_name, self.name, self.number, self.type = message_name, name, number, type
        self.repeated = label.startswith("repeated")
        self.packed = label == "repeated packed"
        self.label = label
        self.has_explicit_default = default is not None
        if type in SCALAR_TYPES:
            self.kind = "scalar"
        elif type in ENUMS:
            self.kind = "enum"
            self.enum_values = ENUMS[type]
            self.enum_names = {number: name for name, number in ENUMS[type].items()}
        elif type in MESSAGES:
            self.kind = "message"
        else:
            raise KeyError(f"{message_name}.{name}: unknown type {type!r}")
        if default is None and self.kind == "scalar":
            default = _ZERO[type]
        elif default is None and self.kind == "enum":
            default = next(iter(ENUMS[type]))  # proto2: the first listed value
        elif self.kind == "scalar" and type in ("float", "double"):
            default = float(default)
        self.default = default  # None for message fields (a default instance)

    @property
    def type_label(self):
        """How error messages describe the type: 'uint32', 'enum PoolingParameter.PoolMethod'."""
        if self.kind == "enum":
            return f"enum {self.type}"
        if self.kind == "message":
            return f"message {self.type}"
        return self.type

    def __repr__(self):
        return (
            f"FieldDescriptor({self.message_name}.{self.name} = {self.number}: "
            f"{self.label} {self.type}, default={self.default!r})"
        )


class MessageDescriptor:
    """A message type: its fields by name and by number, in caffe.proto's order."""

    def __init__(self, name, rows):
        self.name = name
        self.fields = [FieldDescriptor(name, *row) for row in rows]
        self.by_name = {f.name: f for f in self.fields}
        self.by_number = {f.number: f for f in self.fields}
        # Protobuf prints (and encodes) fields in field-number order; that is why caffe.proto
        # gives NetParameter.layer the number 100: the layers come after the net's settings.
        self.fields_by_number = sorted(self.fields, key=lambda f: f.number)

    def field(self, name):
        """The descriptor of field ``name``; AttributeError with a did-you-mean if none."""
        try:
            return self.by_name[name]
        except KeyError:
            raise AttributeError(
                f"message {self.name} has no field '{name}'" + suggest(name, self.by_name, f"fields of {self.name}")
            ) from None

    def __repr__(self):
        return f"MessageDescriptor({self.name}, {len(self.fields)} fields)"


SCHEMA = {name: MessageDescriptor(name, rows) for name, rows in MESSAGES.items()}


def descriptor(type_name):
    """The MessageDescriptor of ``type_name``; KeyError with a did-you-mean if unknown."""
    try:
        return SCHEMA[type_name]
    except KeyError:
        raise KeyError(f"unknown message type '{type_name}'" + suggest(type_name, SCHEMA, "message types")) from None
