"""Lesson 4: training with a solver.

A solver prototxt names the net and the optimization: learning rate and its policy, momentum,
weight decay, when to test and to snapshot.  ``caffe.get_solver`` builds the training net and
the test nets; ``step(n)`` trains; snapshots let a run stop and continue exactly.
"""

import os
import tempfile

import numpy as np

import minicaffe as caffe
from minicaffe import data
from minicaffe.solvers import load_solver_param

QUICK = os.environ.get("MINICAFFE_TUTORIAL_QUICK") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
iters = 16 if QUICK else 500

solver_path = os.path.join(ROOT, "nets", "lenet_solver.prototxt")
if QUICK:
    # the tests run this lesson without MNIST: a learnable synthetic set of the same shape
    for name in ("mnist_train", "mnist_test"):
        ds = data.synthetic_dataset((1, 28, 28), num_classes=10, count=256, seed=1)
        data.register_dataset(name, ds.images, ds.labels)

out = tempfile.mkdtemp(prefix="lesson4-")
param, base = load_solver_param(solver_path)
param.snapshot_prefix = os.path.join(out, "lenet")
param.test_interval = 0
param.display = 0
solver = caffe.get_solver(param, base_dir=base, log=lambda m: None)
print(f"training {solver.net.name}: {sum(p.count for p in solver.net.learnable_params)} parameters")

losses = []
solver.on_iteration.append(lambda s, loss, lr: losses.append(loss))
solver.step(iters // 2)
weights, state = solver.snapshot()
solver.step(iters - iters // 2)
print(f"loss: first {np.mean(losses[:10]):.3f}, last {np.mean(losses[-10:]):.3f}")
assert np.mean(losses[-10:]) < np.mean(losses[:10])

# A new solver restored from the snapshot repeats the second half exactly.
again = caffe.get_solver(param, base_dir=base, log=lambda m: None)
again.restore(state)
resumed = []
again.on_iteration.append(lambda s, loss, lr: resumed.append(loss))
again.step(iters - iters // 2)
print("resumed run repeats the losses exactly:", resumed == losses[iters // 2 :])
assert resumed == losses[iters // 2 :]

accuracy = again.test(0)["accuracy"] if not QUICK else None
print("test accuracy:", accuracy)
print("lesson 4 done")
