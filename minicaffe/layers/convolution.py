"""Convolution: im2col + one GEMM per group over the whole batch (Caffe's ConvolutionLayer), or
Winograd's minimal filtering where it applies (see "Winograd's route" below).

Shapes (2 spatial axes; N images, C input channels, M = num_output, G = group)::

    bottom  x  (N, C, H, W)
    weight  w  (M, C/G, kh, kw)            bias b (M,)      (bias_term, default true)
    top     y  (N, M, OH, OW)     OH = (H + 2 ph - (dh (kh-1) + 1)) // sh + 1   (same for OW)

Forward, with K = C/G * kh * kw and P = N * OH * OW::

    col = im2col(x)                        (G*K, P)     column n*OH*OW + oh*OW + ow
    out[g] = w[g] (M/G, K) @ col[g] (K, P)              one GEMM per group, whole batch
    y = out (M, N, OH*OW) transposed to (N, M, OH*OW) + b

Backward (``dout`` = top diff laid out as (M, P))::

    dw[g] += dout[g] @ col[g]^T            accumulates: the solver clears parameter diffs
    db    += dout summed over P
    dx     = col2im(w[g]^T @ dout[g])

im2col and col2im are the backend's kernels (``kernels/im2col.py`` on the CPU, whose version
``kernels.use("im2col", ...)`` selects; ``kernels/cuda/im2col.py`` on a GPU).  A numpy version
with one strided copy per kernel tap (rows (c, i, j) of col, read as (C, N, OH, OW), are the
input shifted by the tap) was measured against the default kernel ``v3_flat`` on LeNet's and
CIFAR-10's shapes: within 10% either way, so the layer uses the kernel and the ladder stays
the engine's.  A 1x1 convolution of one image with stride 1 and no pad needs no columns at
all: the image (C, H*W) is the column matrix.

The column buffer is kept between calls (capacity-based, like a Blob) and, when the batch fits
one chunk and ``recompute`` is not set, reused by backward instead of running im2col again (backward follows the forward of
the same bottoms, Caffe's contract; a key records which bottom and chunk the buffer holds).  A batch whose column buffer would
exceed ``COL_LIMIT`` elements is processed in chunks of images (AlexNet's conv1 at batch 256
would otherwise need a 1 GB buffer).

Winograd's route (``winograd_rule``; kernels/winograd.py).  With ``engine: DEFAULT`` (the
default), on the host, a stride-1 undilated 3x3 or 5x5 convolution without groups and with at
least WINOGRAD_MIN_CHANNELS input and output channels and WINOGRAD_MIN_TILES output tiles per
lane runs F(4x4, r x r): input tiles and
filters transformed, (4 + r - 1)^2 GEMMs over the channels, the outputs transformed back; its
backward transforms dy once for both gradients and reads the forward's transformed input (kept
in the column buffer, as im2col's columns are) for dW.  On LeNet's conv2 that is 0.43x the
im2col route's time per lane, forward + backward (docs/KERNELS.md, "Winograd").  Its float32
results are not the im2col route's bits: they are within 2e-5 of the largest |value| of it
(measured 4e-6 to 1.3e-5 on LeNet's and CIFAR-10 quick's layers; direct float32 sums: 2e-7 to
6e-7); float64 results agree to ~1e-12.  ``engine: CAFFE`` keeps im2col + GEMM.

Speed notes (LeNet TRAIN, batch 64, one thread): the GEMMs run on BLAS; the top's (N, M, P)
layout differs from the GEMM's (M, N*P), so forward adds the bias while transposing (one pass)
and backward transposes the top diff once (M*N*P values, ~0.1 ms on conv2).  One GEMM per group
over the whole chunk beats one GEMM per image writing straight into the top (fewer, larger
calls).  No bottom diff is computed where the Net says none is needed (the first conv).
"""

from kernels import winograd as _winograd

from ..layer import Layer, Scratch, register
from ..parallel import lanes
from ._common import WorkBuffer, add_lane_gradients, fill_blob, grouped_gemm, has, shape_str, spatial_geometry

#: most elements a column buffer may hold before the batch is split into chunks of images
COL_LIMIT = 1 << 25

#: fewest input and output channels for the Winograd route (the rule in ``winograd_rule``)
WINOGRAD_MIN_CHANNELS = 16
#: fewest output tiles per lane: below, its fixed costs (alpha^2 GEMM calls, the filters'
#: transform) lose to im2col (LeNet's conv2, one core: 4 images = 16 tiles 0.23 vs 0.20 ms,
#: 8 images 0.30 vs 0.38 ms)
WINOGRAD_MIN_TILES = 32


def winograd_rule(engine, host, group, channels, num_output, kh, kw, sh, sw, dh, dw, tiles):
    """Whether a convolution runs Winograd's F(4x4, r x r) (kernels/winograd.py) rather than
    im2col + GEMM: ``engine`` DEFAULT (CAFFE keeps Caffe's im2col route), on the host, no groups,
    a square 3x3 or 5x5 kernel at stride 1 without dilation, at least WINOGRAD_MIN_CHANNELS
    input and output channels (its GEMMs run over the input channels, so with few of them the
    tile transforms are the work: LeNet's conv1, one channel, has its own direct kernel), and
    at least WINOGRAD_MIN_TILES 4x4 output tiles per lane (``tiles``)."""
    return (
        engine == "DEFAULT"
        and tiles >= WINOGRAD_MIN_TILES
        and host
        and group == 1
        and min(channels, num_output) >= WINOGRAD_MIN_CHANNELS
        and _winograd.supported(kh, kw, sh, sw, dh, dw, _winograd.tile_for(kh))
    )


class _ConvBase(Layer):
    """What Convolution and Deconvolution share: parameters, geometry, shape checks."""

    min_bottom, max_bottom = 1, None
    min_top, max_top = 1, None
    backward_reads = "bottom"  # dW = dy (x)^T needs x; dx = W^T dy needs no data

    def scratch(self):
        """im2col's columns (kept for backward unless ``recompute``), the GEMM output, and the
        lanes' partial parameter gradients (one block per lane after the first)."""
        out = []
        for name, buf, span in (
            ("col", self._col, "call" if self.recompute else "layer"),
            ("out", self._out, self.out_span),
            ("dparams", self._dparams, "call"),
        ):
            if buf.buf is not None:
                out.append(Scratch(name, buf.buf, buf.attach, span))
        return out

    def check_arity(self, bottom, top):
        super().check_arity(bottom, top)
        if len(bottom) != len(top):
            raise self.error(
                f"takes as many tops as bottoms (one output per input), got "
                f"{len(bottom)} bottom(s) and {len(top)} top(s)"
            )

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        if p.axis not in (1, -3):
            raise self.error(f"axis {p.axis} is not supported: only axis 1 (N, C, H, W) is")
        x = bottom[0]
        if x.num_axes != 4:
            raise self.error(
                f"bottom[0] has shape {shape_str(x.shape)}; only 2-d convolution of 4-d blobs (N, C, H, W) is supported"
            )
        (self.kh, self.kw), (self.ph, self.pw), (self.sh, self.sw), (self.dh, self.dw) = spatial_geometry(self, p)
        if not has(p, "num_output") or p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        self.num_output = int(p.num_output)
        self.group = int(p.group)
        self.channels = x.shape[1]
        if self.group <= 0:
            raise self.error(f"group must be positive, got {self.group}")
        if self.channels % self.group:
            raise self.error(f"bottom[0] has {self.channels} channels but group {self.group} does not divide it")
        if self.num_output % self.group:
            raise self.error(f"num_output {self.num_output} is not divisible by group {self.group}")
        self.bias_term = bool(p.bias_term)
        self.blobs = [self.new_blob(self.weight_shape(), self.name + "/weight")]
        fill_blob(self.blobs[0], p.weight_filler)
        if self.bias_term:
            self.blobs.append(self.new_blob((self.num_output,), self.name + "/bias"))
            fill_blob(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)
        self._col = WorkBuffer(self.xp, self.dtype)
        self._out = WorkBuffer(self.xp, self.dtype)
        self._dparams = WorkBuffer(self.xp, self.dtype)
        self._col_key = None
        self._lanes_reuse = False  # backward_images: the lanes' columns are forward's (prepare_lanes)
        self._direct = False
        self._rows = False
        self._wino = False  # Winograd's route (winograd_rule); then _col holds the transformed input
        self._U = None  # the transformed filters, made on the calling thread before the lanes run
        self._U_of = None  # the weights U was made from (_filters)
        self.filter_transforms = 0  # how many times _filters made U (once per change of the weights)
        self._shaped = None  # (bottom shapes, top shapes, lanes) of the last reshape
        self._rounds_of = {}  # _rounds' plan per (images, lanes)
        self._wino_ws = []  # one winograd.Workspace per lane: its temporaries, kept
        self._nobias = self.xp.empty(0, self.dtype)  # "no bias" for the backend's direct kernels

    def check_bottoms(self, bottom):
        first = bottom[0]
        for i, b in enumerate(bottom):
            if b.num_axes != 4:
                raise self.error(f"bottom[{i}] has shape {shape_str(b.shape)}; expected 4 axes (N, C, H, W)")
            if b.shape != first.shape:
                raise self.error(
                    f"all bottoms must have the same shape: bottom[0] {shape_str(first.shape)} "
                    f"vs bottom[{i}] {shape_str(b.shape)}"
                )
        if first.shape[1] != self.channels:
            raise self.error(
                f"bottom[0] has {first.shape[1]} channels but the layer was set up "
                f"for {self.channels} (weights {shape_str(self.blobs[0].shape)})"
            )

    def im2col(self, x, col, oh, ow):
        """col (C*kh*kw, n*OH*OW) = the columns of x (n, C, H, W): the backend's kernel."""
        self.backend.im2col(x, self.kh, self.kw, self.ph, self.pw, self.sh, self.sw, self.dh, self.dw, col)

    def chunk(self, n, per_image):
        """Images per chunk so that a column buffer stays under COL_LIMIT elements."""
        return max(1, min(n, COL_LIMIT // max(1, per_image)))


@register
class Convolution(_ConvBase):
    type = "Convolution"
    out_span = "call"

    def weight_shape(self):
        return (self.num_output, self.channels // self.group, self.kh, self.kw)

    @property
    def route(self):
        """How the last reshape chose to compute: "winograd", "direct" (the backend's kernel for
        few input taps) or "im2col" (im2col + GEMM, Caffe's)."""
        return "winograd" if self._wino else "direct" if self._direct else "im2col"

    def reshape(self, bottom, top):
        shaped = (tuple(b.shape for b in bottom), tuple(t.shape for t in top), lanes.count())
        if shaped == self._shaped:
            self._col_key = None
            return  # as the last call left it (every iteration of a run: the net reshapes each forward)
        self.check_bottoms(bottom)
        n, c, h, w = bottom[0].shape
        oh = (h + 2 * self.ph - (self.dh * (self.kh - 1) + 1)) // self.sh + 1
        ow = (w + 2 * self.pw - (self.dw * (self.kw - 1) + 1)) // self.sw + 1
        if oh <= 0 or ow <= 0:
            raise self.error(
                f"bottom[0] of shape {shape_str(bottom[0].shape)} is smaller than the dilated kernel "
                f"({self.dh * (self.kh - 1) + 1}x{self.dw * (self.kw - 1) + 1}) with pad "
                f"({self.ph},{self.pw}): output would be {oh}x{ow}"
            )
        self.out_h, self.out_w = oh, ow
        self._pointwise = (self.kh, self.kw, self.ph, self.pw, self.sh, self.sw) == (1, 1, 0, 0, 1, 1)
        # few input taps (LeNet's conv1): the backend's direct kernels, no columns, where it has them
        cg = self.channels // self.group
        self._direct = self.group == 1 and self.backend.conv_direct(cg, self.kh, self.kw, self.sh, self.sw)
        # On the host the column gradient is computed transposed, one row per output pixel
        # (rows = d(col)^T = dout^T @ W): OpenBLAS runs it 1.37x faster than W^T @ dout on LeNet's
        # conv2 (docs/KERNELS.md), and the backend's col2im takes it when handed rows.T.  A GPU
        # backend keeps Caffe's layout, as do grouped and 1x1 convolutions.
        self._rows = self.backend.host_lanes and self.group == 1 and not self._pointwise and not self._direct
        self._wino = not self._direct and winograd_rule(
            self.param.convolution_param.engine, self.backend.host_lanes, self.group, self.channels,
            self.num_output, self.kh, self.kw, self.sh, self.sw, self.dh, self.dw,
            -(-n // lanes.count()) * -(-oh // 4) * -(-ow // 4),
        )  # fmt: skip
        self._m = _winograd.tile_for(self.kh)
        for t in top:
            t.reshape(n, self.num_output, oh, ow)
        self._col_key = None
        # size the work buffers for the largest round now (empty: no page is touched before use),
        # so that a memory plan made before the first forward places them (memory.plan_training)
        self._reserve(self._rounds(n)[0][1], gemm=not self._direct)
        self._shaped = (tuple(b.shape for b in bottom), tuple(t.shape for t in top), lanes.count())

    # -- the GEMMs, on one chunk of images (one lane's share of a round) ----------------------------
    def _forward_chunk(self, lane, x, y):
        """x (n, C, H, W) -> y (n, M, OH, OW); leaves im2col(x) in the lane's column buffer,
        unless the backend's direct kernel took the convolution (few input taps: no columns)."""
        be, G = self.backend, self.group
        if self._direct:
            bias = self.blobs[1].dev_data if self.bias_term else self._nobias
            geo = (self.ph, self.pw, self.sh, self.sw, self.dh, self.dw)
            be.conv_direct_fwd(x, self.blobs[0].dev_data, bias, *geo, y)
            return
        n = x.shape[0]
        if self._wino:
            bias = self.blobs[1].dev_data if self.bias_term else self._nobias
            keep = self._col.part(lane, self._tiles(n))
            w = self.blobs[0].dev_data
            _winograd.fwd(x, w, bias, self.ph, self.pw, y, self._m, U=self._U, keep=keep, ws=self._wino_work(lane, n))
            return
        M = self.num_output
        K = self.channels // G * self.kh * self.kw
        P = n * self.out_h * self.out_w
        if self._pointwise and n == 1:
            col = x.reshape(G * K, P)  # a 1x1 conv of one image: the image is col
        else:
            col = self._col.part(lane, G * K, P)
            self.im2col(x, col, self.out_h, self.out_w)
        w = self.blobs[0].dev_data.reshape(M, K)
        # With one image, (M, OH*OW) is already the top's layout: GEMM straight into it.
        out = y.reshape(M, P) if n == 1 else self._out.part(lane, M, P)
        grouped_gemm(be, G, False, False, w, col, 0.0, out)
        y3 = y.reshape(n, M, -1)
        if n == 1:
            if self.bias_term:
                y3 += self.blobs[1].dev_data.reshape(1, M, 1)
        elif self.bias_term:
            self.xp.add(out.reshape(M, n, -1).transpose(1, 0, 2), self.blobs[1].dev_data.reshape(1, M, 1), out=y3)
        else:
            y3[...] = out.reshape(M, n, -1).transpose(1, 0, 2)

    def _backward_chunk(self, lane, reuse, x, dy, dx):
        """Lane 0 accumulates dW and db into the parameter diffs; lane k > 0 writes its own
        partial sums into ``_dparams`` slot k-1 (summed in lane order by ``backward``)."""
        be, G = self.backend, self.group
        n = x.shape[0]
        M = self.num_output
        K = self.channels // G * self.kh * self.kw
        P = n * self.out_h * self.out_w
        if lane:
            part = self._dparams.part(lane - 1, M * K + M)
            dw, db, beta = part[: M * K].reshape(M, K), part[M * K :], 0.0
        else:
            dw, db, beta = self.blobs[0].dev_diff.reshape(M, K), None, 1.0
        want_dw = self.param_propagate_down[0]
        want_db = self.bias_term and self.param_propagate_down[1]
        if self._wino:
            if want_db:  # per image then over the images: no copy of dy (the bias_bwd kernel transposes it)
                part_db = dy.reshape(n, M, -1).sum(axis=2).sum(axis=0)
                if lane:
                    db[...] = part_db
                else:
                    self.blobs[1].dev_diff[...] += part_db
            if want_dw or dx is not None:
                kept = self._col.part(lane, self._tiles(n)) if reuse else None
                _winograd.bwd(
                    x.shape, dy, self.blobs[0].dev_data, self.ph, self.pw, dx, dw.reshape(self.blobs[0].shape)
                    if want_dw else None, self._m, U=self._U, kept=kept, x=x, beta=beta, ws=self._wino_work(lane, n),
                )  # fmt: skip
            return
        if self._direct and want_dw:
            # the backend's direct kernel accumulates both parameter gradients straight from x
            # and dy (no columns; lane k > 0: into its zeroed block)
            if lane:
                part[...] = 0
            gb = (db if lane else self.blobs[1].dev_diff) if want_db else self._nobias
            geo = (self.ph, self.pw, self.sh, self.sw, self.dh, self.dw)
            be.conv_direct_bwd_filter(x, dy, *geo, dw.reshape(self.blobs[0].shape), gb)
            if dx is None:
                return
            want_dw = want_db = False
        col = x.reshape(G * K, P) if self._pointwise and n == 1 else self._col.part(lane, G * K, P)
        dout = dy.reshape(M, P) if n == 1 else self._out.part(lane, M, P)
        if want_db and not lane:
            # the bias gradient and the (n, M, S) -> (M, n*S) transpose the GEMMs read, in one pass
            # (backend.bias_bwd: one launch on a GPU, where it was a copy, a sum and an add)
            be.bias_bwd(dy.reshape(n, M, -1), self.blobs[1].dev_diff, None if n == 1 else dout)
        else:
            if n > 1:
                dout.reshape(M, n, -1)[...] = dy.reshape(n, M, -1).transpose(1, 0, 2)
            if want_db:
                db[...] = dout.sum(axis=1)
        if want_dw:
            if not reuse and not (self._pointwise and n == 1):
                self.im2col(x, col, self.out_h, self.out_w)  # forward's columns are gone
            grouped_gemm(be, G, False, True, dout, col, beta, dw)
        if dx is not None:
            # d(col) = w^T @ dout goes into the column buffer, then col2im sums it into dx.
            w = self.blobs[0].dev_data.reshape(M, K)
            if self._rows:
                # on the host, transposed: d(rows) = dout^T @ w, one row per output pixel, in the
                # same buffer (dW has read the columns); col2im takes it as rows.T
                rows = self._col.part(lane, P, K)
                be.gemm(True, False, 1.0, dout, w, 0.0, rows)
                be.col2im(rows.T, self.kh, self.kw, self.ph, self.pw, self.sh, self.sw, self.dh, self.dw, dx)
                return
            if self._pointwise and n == 1:
                col = dx.reshape(G * K, P)  # d(col) is dx itself: the GEMMs write it
            grouped_gemm(be, G, True, False, w, dout, 0.0, col)
            if not (self._pointwise and n == 1):
                be.col2im(col, self.kh, self.kw, self.ph, self.pw, self.sh, self.sw, self.dh, self.dw, dx)

    # -- the contract ---------------------------------------------------------------------------
    def _rounds(self, n):
        """[(start, [(a, b) per lane])]: the batch in rounds of up to ``lanes.count()`` chunks
        run at once, each chunk small enough that the round's column buffers fit COL_LIMIT."""
        nl = lanes.count()
        key = (n, nl, self.out_h, self.out_w)
        plan = self._rounds_of.get(key)
        if plan is None:
            per_image = self.channels * self.kh * self.kw * self.out_h * self.out_w
            per = max(1, min(-(-n // nl), COL_LIMIT // max(1, per_image * nl)))
            size = per * nl
            plan = [(s, [(a, min(a + per, n)) for a in range(s, min(s + size, n), per)]) for s in range(0, n, size)]
            plan = self._rounds_of[key] = tuple((s, tuple(parts)) for s, parts in plan)
        return list(plan)

    def _tiles(self, n):
        """Values of n images' transformed input (Winograd's route)."""
        shape = (n, self.channels, self.out_h + self.kh - 1 - 2 * self.ph, self.out_w + self.kw - 1 - 2 * self.pw)
        return _winograd.tiles_size(shape, self.blobs[0].shape, self.ph, self.pw, self._m)

    def _products(self, n):
        """Values of the largest block of products for n images (Winograd's route)."""
        shape = (n, self.channels, self.out_h + self.kh - 1 - 2 * self.ph, self.out_w + self.kw - 1 - 2 * self.pw)
        return _winograd.block_products_size(shape, self.blobs[0].shape, self.ph, self.pw, self._m)

    def _wino_work(self, lane, n):
        """Lane ``lane``'s winograd.Workspace, its block of products at the end of the lane's
        column block (the kept tiles are at its start)."""
        ws = self._wino_ws[lane]
        block = self._col.part(lane, self._col.block)
        ws.provide("Mx", block[block.size - self._products(n) :])
        return ws

    def _filters(self):
        """Winograd's transformed filters U for the weights as they are now, made on the calling
        thread before the lanes run (they read U).  U is made again only when the weights differ
        from the copy it was made from (``_U_of``), compared bit for bit (~3 us on LeNet's conv2
        against ~70 us for the transform): backward reuses forward's U, and a write to the weights
        by any path between two passes (the solver's update, a gradient check's perturbation,
        pycaffe's ``blob.data[...] =``) is seen.  U is made from the copy, so it is exactly the
        transform of the weights that were compared."""
        if not self._wino:
            return
        w = self.blobs[0].dev_data
        if self._U is not None and _winograd.same_bits(w, self._U_of):
            return
        n = (self._m + self.kh - 1) ** 2 * w.size // (self.kh * self.kw)
        if self._U is None or self._U.size != n or self._U_of.shape != w.shape:
            self._U = self.xp.empty(n, self.dtype)
            self._U_of = self.xp.empty(w.shape, self.dtype)
        self._U_of[...] = w
        self._U = _winograd.filters(self._U_of, self._m, out=self._U)
        self.filter_transforms += 1

    def _reserve(self, parts, gemm=True):
        """Size the buffers for a round before its lanes start (they only take views); the
        column and GEMM buffers only where GEMMs run (``gemm``)."""
        G, M = self.group, self.num_output
        K = self.channels // G * self.kh * self.kw
        P = max(b - a for a, b in parts) * self.out_h * self.out_w
        if self._wino:
            # Winograd's route keeps the buffers im2col's would have, so that a memory plan (the
            # arena's layout) does not depend on the route: a lane's column buffer holds its
            # transformed input, kept from forward for the weight gradient, then its block of
            # products (far less than the columns: 0.57 of a million values for a lane of LeNet's
            # conv2 against 1.02); the GEMM-output buffer is not used.
            n = max(b - a for a, b in parts)
            self._col.reserve(len(parts), max(G * K * P, self._tiles(n) + self._products(n)))
            self._out.reserve(len(parts), M * P)
            self._wino_ws += [_winograd.Workspace() for _ in range(len(parts) - len(self._wino_ws))]
        elif gemm:
            self._col.reserve(len(parts), G * K * P)
            self._out.reserve(len(parts), M * P)
        if len(parts) > 1:
            self._dparams.reserve(len(parts) - 1, M * K + M)

    def forward(self, bottom, top):
        self._filters()
        for i, (b, t) in enumerate(zip(bottom, top)):
            x, y = b.dev_data, t.dev_data
            for s, parts in self._rounds(b.shape[0]):
                self._reserve(parts, gemm=not self._direct)
                lanes.run([self._lane(self._forward_chunk, k, x[a:z], y[a:z]) for k, (a, z) in enumerate(parts)])
                self._col_key = None if self._direct else (i, s)  # the column buffers hold im2col of this round
        if self.recompute:
            self._col_key = None  # backward runs im2col again (Caffe's behaviour)

    @staticmethod
    def _lane(fn, *args):
        return lambda: fn(*args)

    def backward(self, top, propagate_down, bottom):
        need_params = any(self.param_propagate_down)
        for i, (b, t) in enumerate(zip(bottom, top)):
            if not (need_params or propagate_down[i]):
                continue
            x, dy = b.dev_data, t.dev_diff
            dx = b.dev_diff if propagate_down[i] else None
            if propagate_down[i]:
                self._filters()  # the weights the data gradient reads, as they are now
            # Visit the round forward left in the buffers first, so its im2col is not redone.
            rounds = self._rounds(b.shape[0])
            if self._col_key is not None and self._col_key[0] == i:
                rounds.sort(key=lambda r: r[0] != self._col_key[1])
            for s, parts in rounds:
                reuse = self._col_key == (i, s)
                self._reserve(parts, gemm=not (self._direct and self.param_propagate_down[0]) or dx is not None)
                lanes.run(
                    [
                        self._lane(self._backward_chunk, k, reuse, x[a:z], dy[a:z], None if dx is None else dx[a:z])
                        for k, (a, z) in enumerate(parts)
                    ]
                )
                self._col_key = (i, s) if dx is None else None  # d(col) overwrote the columns
                self.reduce_lanes(parts)

    # -- the step plan's per-image calls (minicaffe/parallel/plan.py) -----------------------------
    def lanes_ok(self, bottom, top):
        """One bottom whose whole batch of columns fits COL_LIMIT (one round: a lane's chunk is
        its slice of the batch, and its columns stay in its buffer for backward)."""
        if len(bottom) != 1:
            return False
        n, per_image = bottom[0].shape[0], self.channels * self.kh * self.kw * self.out_h * self.out_w
        return n * per_image <= COL_LIMIT

    def prepare_lanes(self, bottom, top, parts, propagate_down):
        key = ("lanes", tuple(parts))  # the lanes' column buffers hold im2col of these slices
        if propagate_down is None or propagate_down[0]:
            self._filters()
        if propagate_down is None:
            self._reserve(parts, gemm=not self._direct)
            self._col_key = None if (self._direct or self.recompute) else key
        else:
            self._reserve(parts, gemm=not (self._direct and self.param_propagate_down[0]) or propagate_down[0])
            self._lanes_reuse = self._col_key == key
            self._col_key = None if propagate_down[0] else self._col_key  # d(col) overwrites the columns

    def forward_images(self, lane, a, b, bottom, top):
        self._forward_chunk(lane, bottom[0].dev_data[a:b], top[0].dev_data[a:b])

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        if not (any(self.param_propagate_down) or propagate_down[0]):
            return
        dx = bottom[0].dev_diff[a:b] if propagate_down[0] else None
        self._backward_chunk(lane, self._lanes_reuse, bottom[0].dev_data[a:b], top[0].dev_diff[a:b], dx)

    def reduce_lanes(self, parts):
        add_lane_gradients(self, self._dparams, parts)
