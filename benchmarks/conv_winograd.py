"""Winograd F(4x4, r x r) against im2col + GEMM, side by side in one process, on one core.

    python benchmarks/conv_winograd.py [--repeats 7] [--calls 20]

Two tables.  Kernels (``kernels.conv``'s v3_im2col_blas and v7_winograd rungs): forward, data
gradient and weight gradient, each timed alone, as ratios, with the float32 error of each
against the float64 reference (max |error| / max |reference|).  Layers (the Convolution layer
with ``engine: CAFFE``, im2col + GEMM, against the default route, Winograd): forward, and
backward (dx, dW, db) with the columns or transformed tiles the forward kept, as the engine
runs them.  Rows alternate within each repeat (v3, v7, v3, v7, ...) and the medians are
reported, with the load average before and after.  BLAS runs one thread.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from kernels import conv as K  # noqa: E402

SHAPES = [
    # name, x (N, C, H, W), w (M, C, r, r), pad
    ("LeNet conv2, one lane", (32, 20, 12, 12), (50, 20, 5, 5), 0),
    ("LeNet conv2, batch 64", (64, 20, 12, 12), (50, 20, 5, 5), 0),
    ("CIFAR-10 quick conv2, one lane", (50, 32, 16, 16), (32, 32, 5, 5), 2),
    ("CIFAR-10 quick conv3, one lane", (50, 32, 8, 8), (64, 32, 5, 5), 2),
]


def _timed(fn, calls):
    t = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t) / calls * 1e3


def kernels_table(repeats, calls):
    rng = np.random.default_rng(0)
    rows = []
    for name, xs, ws, p in SHAPES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(ws[1] * 25)).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        OH = xs[2] + 2 * p - ws[2] + 1
        y = np.empty((xs[0], ws[0], OH, OH), np.float32)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        dx, dw = np.empty(xs, np.float32), np.empty(ws, np.float32)
        g = (p, p, 1, 1, 1, 1)
        refs = (
            K.conv_fwd_reference(x, w, b, *g),
            K.conv_bwd_data_reference(dy, w, *g, xs),
            K.conv_bwd_filter_reference(x, dy, *g, ws),
        )
        for what, out, ref, run in (
            ("forward", y, refs[0], lambda f: f(x, w, b, *g, y)),
            ("data gradient", dx, refs[1], lambda f: f(dy, w, *g, dx)),
            ("weight gradient", dw, refs[2], lambda f: f(x, dy, *g, dw)),
        ):
            fam = {"forward": "conv_fwd", "data gradient": "conv_bwd_data", "weight gradient": "conv_bwd_filter"}[what]
            fns = [K.VERSIONS[fam]["v3_im2col_blas"], K.VERSIONS[fam]["v7_winograd"]]
            errs = []
            for f in fns:
                run(f)  # compiled, warm
                errs.append(float(np.abs(out - ref).max() / np.abs(ref).max()))
            ts = [[], []]
            for _ in range(repeats):
                for k, f in enumerate(fns):
                    ts[k].append(_timed(lambda f=f: run(f), calls))
            t3, t7 = np.median(ts[0]), np.median(ts[1])
            rows.append((name, what, t3, t7, t7 / t3, errs[0], errs[1]))
            print(
                f"| {name} | {what} | {t3:.3f} | {t7:.3f} | {t7 / t3:.2f}x | {errs[0]:.1e} | {errs[1]:.1e} |",
                flush=True,
            )
    return rows


def layers_table(repeats, calls):
    from minicaffe.backend import cpu
    from minicaffe.blob import Blob
    from minicaffe.layer import create_layer
    from minicaffe.proto import parse

    rng = np.random.default_rng(1)
    for name, xs, ws, p in SHAPES:
        x = rng.standard_normal(xs).astype(np.float32)
        made = []
        for engine in ("CAFFE", "DEFAULT"):
            text = (
                f'name: "conv" type: "Convolution" convolution_param {{ engine: {engine} num_output: {ws[0]} '
                f'kernel_size: {ws[2]} pad: {p} weight_filler {{ type: "gaussian" std: 0.05 }} }}'
            )
            layer = create_layer(parse(text, "LayerParameter"), cpu, dtype=np.float32)
            bottom, top = Blob(xs, dtype=np.float32), Blob((1,), dtype=np.float32)
            bottom.data[...] = x
            layer.setup([bottom], [top])
            if made:
                for a, b in zip(layer.blobs, made[0][0].blobs):
                    a.data[...] = b.data
            top.diff[...] = np.random.default_rng(2).standard_normal(top.shape)
            made.append((layer, bottom, top))

        def fwd(m):
            layer, bottom, top = m
            layer.forward([bottom], [top])

        def bwd(m):
            layer, bottom, top = m
            layer.backward([top], [True], [bottom])

        for m in made:
            fwd(m)
            bwd(m)
        routes = [m[0].route for m in made]
        tf, tb = [[], []], [[], []]
        for _ in range(repeats):
            for k, m in enumerate(made):
                tf[k].append(_timed(lambda m=m: fwd(m), calls))
                fwd(m)  # backward reads what this forward kept
                tb[k].append(_timed(lambda m=m: bwd(m), calls))
        f0, f1, b0, b1 = (float(np.median(v)) for v in (tf[0], tf[1], tb[0], tb[1]))
        print(
            f"| {name} | {routes[0]} / {routes[1]} | {f0:.3f} / {f1:.3f} ({f1 / f0:.2f}x) | "
            f"{b0:.3f} / {b1:.3f} ({b1 / b0:.2f}x) | {f0 + b0:.3f} / {f1 + b1:.3f} ({(f1 + b1) / (f0 + b0):.2f}x) |",
            flush=True,
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="alternating rounds (medians reported)")
    ap.add_argument("--calls", type=int, default=20, help="calls per timing")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}; OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
    print("\nKernels, ms per call (thread CPU time, medians):\n")
    print("| shape | pass | v3_im2col_blas | v7_winograd | ratio | error v3 | error v7 |")
    print("|---|---|---|---|---|---|---|")
    kernels_table(args.repeats, args.calls)
    print("\nConvolution layer, engine CAFFE / default, ms per call (thread CPU time, medians):\n")
    print("| shape | route | forward | backward (dx, dW, db) | forward + backward |")
    print("|---|---|---|---|---|")
    layers_table(args.repeats, args.calls)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
