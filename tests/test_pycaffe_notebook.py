"""Caffe's "01-learning-lenet" notebook (examples/01-learning-lenet.ipynb), its cells run as
written for pycaffe, but for the import (``import minicaffe as caffe``; ``from minicaffe import
layers as L, params as P``; ``from minicaffe.proto import caffe_pb2``), Python 3's ``print()``,
and ``caffe.set_mode_gpu()`` run as ``set_mode_cpu()`` where this machine has no GPU.  Shell
cells (``!data/mnist/get_mnist.sh``, ``!cat``) and ``%`` magics are left out: minicaffe fetches
MNIST itself, and ``mnist/mnist_train_lmdb`` names it.

The default run feeds the notebook's data paths a small synthetic digit set (registered under
those very names) and runs the cells up to the first ``solver.step(1)`` and the filter pictures;
the slow run trains on real MNIST through the notebook's whole loop and checks its accuracy.
"""

import os
import textwrap

import numpy as np
import pytest

from minicaffe import backend, data

CELL_IMPORTS = """
from pylab import *
import minicaffe as caffe
"""

CELL_NETSPEC = """
from minicaffe import layers as L, params as P

def lenet(lmdb, batch_size):
    # our version of LeNet: a series of linear and simple nonlinear transformations
    n = caffe.NetSpec()

    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=lmdb,
                             transform_param=dict(scale=1./255), ntop=2)

    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 =   L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type='xavier'))
    n.loss =  L.SoftmaxWithLoss(n.score, n.label)

    return n.to_proto()

with open('mnist/lenet_auto_train.prototxt', 'w') as f:
    f.write(str(lenet('mnist/mnist_train_lmdb', 64)))

with open('mnist/lenet_auto_test.prototxt', 'w') as f:
    f.write(str(lenet('mnist/mnist_test_lmdb', 100)))
"""

# examples/mnist/lenet_auto_solver.prototxt, as Caffe ships it
SOLVER = """\
# The train/test net protocol buffer definition
train_net: "mnist/lenet_auto_train.prototxt"
test_net: "mnist/lenet_auto_test.prototxt"
# test_iter specifies how many forward passes the test should carry out.
# In the case of MNIST, we have test batch size 100 and 100 test iterations,
# covering the full 10,000 testing images.
test_iter: 100
# Carry out testing every 500 training iterations.
test_interval: 500
# The base learning rate, momentum and the weight decay of the network.
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
# The learning rate policy
lr_policy: "inv"
gamma: 0.0001
power: 0.75
# Display every 100 iterations
display: 100
# The maximum number of iterations
max_iter: 10000
# snapshot intermediate results
snapshot: 5000
snapshot_prefix: "mnist/lenet"
"""

CELL_SOLVER = """
caffe.set_device(0)
caffe.set_mode_gpu()

### load the solver and create train and test nets
solver = None  # ignore this workaround for lmdb data (can't instantiate two solvers on the same data)
solver = caffe.SGDSolver('mnist/lenet_auto_solver.prototxt')
"""

CELL_SHAPES = """
# each output is (batch size, feature dim, spatial dim)
blob_shapes = [(k, v.data.shape) for k, v in solver.net.blobs.items()]
# just print the weight sizes (we'll omit the biases)
param_shapes = [(k, v[0].data.shape) for k, v in solver.net.params.items()]
"""

CELL_FORWARD = """
solver.net.forward()  # train net
solver.test_nets[0].forward()  # test net (there can be more than one)
"""

CELL_SHOW_DATA = """
# we use a little trick to tile the first eight images
imshow(solver.net.blobs['data'].data[:8, 0].transpose(1, 0, 2).reshape(28, 8*28), cmap='gray'); axis('off')
print('train labels:', solver.net.blobs['label'].data[:8])
imshow(solver.test_nets[0].blobs['data'].data[:8, 0].transpose(1, 0, 2).reshape(28, 8*28), cmap='gray'); axis('off')
print('test labels:', solver.test_nets[0].blobs['label'].data[:8])
"""

CELL_STEP = """
solver.step(1)
imshow(solver.net.params['conv1'][0].diff[:, 0].reshape(4, 5, 5, 5)
       .transpose(0, 2, 1, 3).reshape(4*5, 5*5), cmap='gray'); axis('off')
"""

CELL_LOOP = """
niter = 200
test_interval = 25
# losses will also be stored in the log
train_loss = zeros(niter)
test_acc = zeros(int(np.ceil(niter / test_interval)))
output = zeros((niter, 8, 10))

# the main solver loop
for it in range(niter):
    solver.step(1)  # SGD by Caffe

    # store the train loss
    train_loss[it] = solver.net.blobs['loss'].data

    # store the output on the first test batch
    # (start the forward pass at conv1 to avoid loading new data)
    solver.test_nets[0].forward(start='conv1')
    output[it] = solver.test_nets[0].blobs['score'].data[:8]

    # run a full test every so often
    # (Caffe can also do this for us and write to a log, but we show here
    #  how to do it directly in Python, where more complicated things are easier.)
    if it % test_interval == 0:
        print('Iteration', it, 'testing...')
        correct = 0
        for test_it in range(100):
            solver.test_nets[0].forward()
            correct += sum(solver.test_nets[0].blobs['score'].data.argmax(1)
                           == solver.test_nets[0].blobs['label'].data)
        test_acc[it // test_interval] = correct / 1e4
"""

CELL_PLOT = """
_, ax1 = subplots()
ax2 = ax1.twinx()
ax1.plot(arange(niter), train_loss)
ax2.plot(test_interval * arange(len(test_acc)), test_acc, 'r')
ax1.set_xlabel('iteration')
ax1.set_ylabel('train loss')
ax2.set_ylabel('test accuracy')
ax2.set_title('Test Accuracy: {:.2f}'.format(test_acc[-1]))
"""

CELL_OUTPUTS = """
for i in range(8):
    figure(figsize=(2, 2))
    imshow(solver.test_nets[0].blobs['data'].data[i, 0], cmap='gray')
    figure(figsize=(10, 2))
    imshow(output[:50, i].T, interpolation='nearest', cmap='gray')
    xlabel('iteration')
    ylabel('label')
"""

# the classic filter visualization (examples/00-classification.ipynb), on LeNet's layers
CELL_VIS_SQUARE = '''
def vis_square(data):
    """Take an array of shape (n, height, width) or (n, height, width, 3)
       and visualize each (height, width) thing in a grid of size approx. sqrt(n) by sqrt(n)"""

    # normalize data for display
    data = (data - data.min()) / (data.max() - data.min())

    # force the number of filters to be square
    n = int(np.ceil(np.sqrt(data.shape[0])))
    padding = (((0, n ** 2 - data.shape[0]),
               (0, 1), (0, 1))                 # add some space between filters
               + ((0, 0),) * (data.ndim - 3))  # don't pad the last dimension (if there is one)
    data = np.pad(data, padding, mode='constant', constant_values=1)  # pad with ones (white)

    # tile the filters into an image
    data = data.reshape((n, n) + data.shape[1:]).transpose((0, 2, 1, 3) + tuple(range(4, data.ndim + 1)))
    data = data.reshape((n * data.shape[1], n * data.shape[3]) + data.shape[4:])

    plt.imshow(data); plt.axis('off')
    return data

net = solver.net
# the parameters are a list of [weights, biases]
filters = net.params['conv1'][0].data
tiled_filters = vis_square(filters[:, 0])
feat = net.blobs['conv1'].data[0, :36]
tiled_features = vis_square(feat)
'''


def digits(n, seed):
    """28x28 uint8 'digits': class k is a bright 6x6 square at one of ten places, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = rng.integers(0, 60, size=(n, 1, 28, 28)).astype(np.uint8)
    for i, k in enumerate(labels):
        r, c = 3 + 11 * (k // 5), 1 + 5 * (k % 5)
        images[i, 0, r : r + 6, c : c + 6] = 255
    return images, labels


@pytest.fixture
def notebook(tmp_path, monkeypatch):
    """The notebook's working directory (examples/), with mnist/lenet_auto_solver.prototxt."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "lenet_auto_solver.prototxt").write_text(SOLVER)
    yield {}
    import matplotlib.pyplot as plt

    plt.close("all")
    backend.set_mode("cpu")


def run_cell(cell, scope):
    code = textwrap.dedent(cell)
    if backend.why_not("gpu") is not None:  # no GPU here: the notebook's one line for a CPU
        code = code.replace("caffe.set_mode_gpu()", "caffe.set_mode_cpu()")
    exec(compile(code, "<01-learning-lenet>", "exec"), scope)


def test_first_cells_netspec_prototxt_sgdsolver_step(notebook, capsys):
    data.register_dataset("mnist/mnist_train_lmdb", *digits(640, 0))
    data.register_dataset("mnist/mnist_test_lmdb", *digits(200, 1))
    try:
        scope = notebook
        for cell in (CELL_IMPORTS, CELL_NETSPEC, CELL_SOLVER, CELL_SHAPES, CELL_FORWARD, CELL_SHOW_DATA):
            run_cell(cell, scope)
        from minicaffe import proto

        train = proto.parse_file("mnist/lenet_auto_train.prototxt")
        assert [layer.name for layer in train.layer] == [
            "data", "conv1", "pool1", "conv2", "pool2", "fc1", "relu1", "score", "loss",
        ]  # fmt: skip
        assert train.layer[0].data_param.backend == "LMDB" and train.layer[0].data_param.batch_size == 64
        assert train.layer[6].top == ["fc1"]  # in place
        assert scope["blob_shapes"] == [
            ("data", (64, 1, 28, 28)), ("label", (64,)), ("conv1", (64, 20, 24, 24)), ("pool1", (64, 20, 12, 12)),
            ("conv2", (64, 50, 8, 8)), ("pool2", (64, 50, 4, 4)), ("fc1", (64, 500)), ("score", (64, 10)),
            ("loss", ()),
        ]  # fmt: skip
        assert scope["param_shapes"] == [
            ("conv1", (20, 1, 5, 5)), ("conv2", (50, 20, 5, 5)), ("fc1", (500, 800)), ("score", (10, 500)),
        ]  # fmt: skip
        assert "train labels: [" in capsys.readouterr().out
        solver = scope["solver"]
        before = solver.net.params["conv1"][0].data.copy()
        run_cell(CELL_STEP, scope)
        assert solver.iter == 1 and not np.array_equal(before, solver.net.params["conv1"][0].data)
        assert np.abs(solver.net.params["conv1"][0].diff).sum() > 0
        # a few more steps, then the notebook's own test: accuracy well above chance
        for _ in range(30):
            solver.step(1)
        net = solver.test_nets[0]
        correct = 0
        for _ in range(2):
            net.forward()
            correct += int((net.blobs["score"].data.argmax(1) == net.blobs["label"].data).sum())
        assert correct / 200 > 0.5
        run_cell(CELL_VIS_SQUARE, scope)
        assert scope["tiled_filters"].shape == (5 * 6, 5 * 6)  # 20 filters on a 5x5 grid, 1-pixel gaps
        assert scope["tiled_features"].shape == (5 * 25, 5 * 25)
    finally:
        data.unregister_dataset("mnist/mnist_train_lmdb")
        data.unregister_dataset("mnist/mnist_test_lmdb")


@pytest.mark.slow
def test_the_whole_notebook_on_real_mnist(notebook, capsys):
    """The notebook's training loop: 200 iterations, a test every 25; the notebook shows ~0.94+."""
    scope = notebook
    for cell in (CELL_IMPORTS, CELL_NETSPEC, CELL_SOLVER, CELL_SHAPES, CELL_FORWARD, CELL_SHOW_DATA, CELL_STEP):
        run_cell(cell, scope)
    run_cell(CELL_LOOP, scope)
    run_cell(CELL_PLOT, scope)
    run_cell(CELL_OUTPUTS, scope)
    run_cell(CELL_VIS_SQUARE, scope)
    acc = scope["test_acc"]
    assert acc[0] < 0.5 and acc[-1] > 0.9, acc
    assert scope["train_loss"][-20:].mean() < 0.5
    assert "Iteration 175 testing..." in capsys.readouterr().out
    assert os.path.exists("mnist/lenet_auto_test.prototxt")
