"""GEMM on the GPU: c = alpha * op(a) @ op(b) + beta * c, from one thread per element to
register blocking, against cuBLAS.

Contract: the CPU family's (``kernels/gemm.py``): op(a) (M, K), op(b) (K, N), c (M, N)
C-contiguous; beta == 0 means c is not read; c may alias a or b (the input is copied first).
Transposes are handled by passing the transposed *view* to the kernel (numba indexes any
strides): no copy, but a transposed operand is read across its rows, so its loads do not
coalesce -- one reason cuBLAS, which has a kernel per layout, stays ahead.  Each wrapper takes
the launcher ``L`` first.  Checked against the CPU file's float64 ``gemm_reference``.

Versions (thread mapping in each kernel's docstring):
  cublas        ``xp.matmul``: cuBLAS on CuPy arrays (in the simulator numpy's BLAS stands in,
                so the engine's code path is the same); the CPU family's ``vendor_gemm`` and
                ``check_operands``, shared.  The baseline, and the default: on a
                GPU nothing here beats it (the benchmark prints the ratio).
  v1_naive      one thread per element of c, K multiply-adds from global memory: each a and b
                element is loaded M or N times over; L1/L2 catch some of it.
  v2_tiled      TILE x TILE blocks; the block stages a TILE x TILE tile of op(a) and of op(b) in
                shared memory, then every thread does TILE multiply-adds from shared memory:
                global traffic drops by a factor TILE.  Still one shared load per FMA.
  v3_regblock   a block of (BM/TM) x (BN/TN) threads computes a BM x BN tile of c; each thread
                keeps a TM x TN sub-tile of c in registers and, per k, loads TM values of a and TN
                of b from shared memory for TM*TN FMAs (an outer product): the FMA:load ratio
                goes from 1:1 to TM*TN:(TM+TN), the step that takes a GEMM to a good fraction of
                cuBLAS (simon boehm's "2D blocktiling").

Tile sizes are compile-time constants (``make_*`` build one kernel per size, cached), so loops
over a tile unroll; the simulator runs the same source with small tiles (``_launch.SIM_CONFIG``).
"""

import functools

from numba import cuda

from .. import _versions
from ..gemm import check_operands, gemm_reference, vendor_gemm  # noqa: F401  (gemm_reference: for the tests)

__all__ = ["gemm", "VERSIONS", "DEFAULTS", "use", "make_tiled", "make_regblock"]


def _unalias(xp, X, c):
    return X.copy() if xp.may_share_memory(X, c) else X


# -- vendor baseline: the CPU family's wrapper, on CuPy (cuBLAS) ---------------------------------------
def gemm_cublas(L, trans_a, trans_b, alpha, a, b, beta, c):
    vendor_gemm(L.xp, trans_a, trans_b, alpha, a, b, beta, c)


# -- v1: one thread per element --------------------------------------------------------------------
@cuda.jit
def _gemm_v1(alpha, A, B, beta, C):
    """Thread (x, y) of the 2-d grid computes C[i, j] with j = x (consecutive threads of a warp:
    consecutive columns, so loads of B[p, j] and stores of C coalesce; A[i, p] is one broadcast
    per warp) and i = y, grid-striding over both."""
    M, K = A.shape
    N = B.shape[1]
    j0, i0 = cuda.grid(2)
    sj, si = cuda.gridsize(2)
    zero = C.dtype.type(0)
    for i in range(i0, M, si):
        for j in range(j0, N, sj):
            acc = zero
            for p in range(K):
                acc += A[i, p] * B[p, j]
            if beta == 0:
                C[i, j] = alpha * acc
            else:
                C[i, j] = alpha * acc + beta * C[i, j]


# -- v2: shared-memory tiles -----------------------------------------------------------------------
@functools.cache
def make_tiled(TILE):
    @cuda.jit
    def gemm_tiled(alpha, A, B, beta, C):
        """Block (TILE, TILE) owns the TILE x TILE tile of C at (by*TILE, bx*TILE) (tiles
        grid-strided over the grid).  Thread (tx, ty) -> C[row0 + ty, col0 + tx].  Per step of
        TILE along K, thread (tx, ty) loads As[ty, tx] = A[row0 + ty, k0 + tx] and
        Bs[ty, tx] = B[k0 + ty, col0 + tx] (0 outside the matrices), the block syncs, and each
        thread does TILE FMAs from shared memory: As[ty, :] is a broadcast, Bs[:, tx] is read
        by consecutive threads at consecutive addresses (no bank conflict)."""
        As = cuda.shared.array((TILE, TILE), dtype=C.dtype)
        Bs = cuda.shared.array((TILE, TILE), dtype=C.dtype)
        M, K = A.shape
        N = B.shape[1]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        zero = C.dtype.type(0)
        for row0 in range(cuda.blockIdx.y * TILE, M, cuda.gridDim.y * TILE):
            for col0 in range(cuda.blockIdx.x * TILE, N, cuda.gridDim.x * TILE):
                i = row0 + ty
                j = col0 + tx
                acc = zero
                for k0 in range(0, K, TILE):
                    As[ty, tx] = A[i, k0 + tx] if (i < M and k0 + tx < K) else zero
                    Bs[ty, tx] = B[k0 + ty, j] if (k0 + ty < K and j < N) else zero
                    cuda.syncthreads()
                    for p in range(TILE):
                        acc += As[ty, p] * Bs[p, tx]
                    cuda.syncthreads()  # before the next step overwrites the tiles
                if i < M and j < N:
                    if beta == 0:
                        C[i, j] = alpha * acc
                    else:
                        C[i, j] = alpha * acc + beta * C[i, j]

    return gemm_tiled


# -- v3: register blocking -------------------------------------------------------------------------
@functools.cache
def make_regblock(BM, BN, BK, TM, TN):
    TY, TX = BM // TM, BN // TN  # the block: TY x TX threads
    NT = TX * TY

    @cuda.jit
    def gemm_regblock(alpha, A, B, beta, C):
        """Block (TX, TY) = (BN/TN, BM/TM) owns a BM x BN tile of C (grid-strided); thread
        (tx, ty) owns the TM x TN sub-tile at rows ty*TM.., columns tx*TN.. of it, held in
        registers (a local array with constant indices).  Per step of BK along K the NT threads
        of the block load the BM x BK slice of A (linear thread t takes elements t, t + NT, ...;
        consecutive t read consecutive k: coalesced) into As stored k-major (As[k, m]) and the
        BK x BN slice of B into Bs[k, n] (consecutive t, consecutive n); then, per k, each thread
        reads TM values As[k, ty*TM + r] and TN values Bs[k, tx*TN + s] into registers and does
        their TM x TN outer product: TM*TN FMAs for TM+TN shared loads."""
        As = cuda.shared.array((BK, BM), dtype=C.dtype)
        Bs = cuda.shared.array((BK, BN), dtype=C.dtype)
        acc = cuda.local.array((TM, TN), dtype=C.dtype)
        af = cuda.local.array(TM, dtype=C.dtype)
        bf = cuda.local.array(TN, dtype=C.dtype)
        M, K = A.shape
        N = B.shape[1]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * TX + tx
        zero = C.dtype.type(0)
        for row0 in range(cuda.blockIdx.y * BM, M, cuda.gridDim.y * BM):
            for col0 in range(cuda.blockIdx.x * BN, N, cuda.gridDim.x * BN):
                for r in range(TM):
                    for s in range(TN):
                        acc[r, s] = zero
                for k0 in range(0, K, BK):
                    for e in range(t, BM * BK, NT):
                        m = e // BK
                        k = e % BK
                        As[k, m] = A[row0 + m, k0 + k] if (row0 + m < M and k0 + k < K) else zero
                    for e in range(t, BK * BN, NT):
                        k = e // BN
                        n = e % BN
                        Bs[k, n] = B[k0 + k, col0 + n] if (k0 + k < K and col0 + n < N) else zero
                    cuda.syncthreads()
                    for k in range(BK):
                        for r in range(TM):
                            af[r] = As[k, ty * TM + r]
                        for s in range(TN):
                            bf[s] = Bs[k, tx * TN + s]
                        for r in range(TM):
                            for s in range(TN):
                                acc[r, s] += af[r] * bf[s]
                    cuda.syncthreads()
                for r in range(TM):
                    i = row0 + ty * TM + r
                    for s in range(TN):
                        j = col0 + tx * TN + s
                        if i < M and j < N:
                            if beta == 0:
                                C[i, j] = alpha * acc[r, s]
                            else:
                                C[i, j] = alpha * acc[r, s] + beta * C[i, j]

    return gemm_regblock


# -- wrappers ------------------------------------------------------------------------------------------
def _prepare(L, trans_a, trans_b, alpha, a, b, beta, c):
    A, B = check_operands(trans_a, trans_b, a, b, c)
    A, B = _unalias(L.xp, A, c), _unalias(L.xp, B, c)
    return A, B, L.scalar(alpha, c.dtype), L.scalar(beta, c.dtype)


def gemm_v1_naive(L, trans_a, trans_b, alpha, a, b, beta, c):
    A, B, al, be = _prepare(L, trans_a, trans_b, alpha, a, b, beta, c)
    if c.size:
        T = L.config.gemm_tile  # (16, 16) blocks on a GPU
        L.launch(_gemm_v1, L.grid2d(c.shape[0], c.shape[1], T, T), (T, T), al, A, B, be, c)


def gemm_v2_tiled(L, trans_a, trans_b, alpha, a, b, beta, c):
    A, B, al, be = _prepare(L, trans_a, trans_b, alpha, a, b, beta, c)
    T = L.config.gemm_tile
    if c.size:
        L.launch(make_tiled(T), L.grid2d(c.shape[0], c.shape[1], T, T), (T, T), al, A, B, be, c)


def gemm_v3_regblock(L, trans_a, trans_b, alpha, a, b, beta, c):
    A, B, al, be = _prepare(L, trans_a, trans_b, alpha, a, b, beta, c)
    BM, BN, BK, TM, TN = L.config.regblock
    if c.size:
        L.launch(
            make_regblock(BM, BN, BK, TM, TN),
            L.grid2d(c.shape[0], c.shape[1], BM, BN),
            (BN // TN, BM // TM),
            al,
            A,
            B,
            be,
            c,
        )


VERSIONS = {
    "gemm": {
        "cublas": gemm_cublas,
        "v1_naive": gemm_v1_naive,
        "v2_tiled": gemm_v2_tiled,
        "v3_regblock": gemm_v3_regblock,
    }
}
DEFAULTS = {"gemm": "cublas"}

gemm = VERSIONS["gemm"][DEFAULTS["gemm"]]


def use(version):
    """Bind gemm to ``version`` (a key of VERSIONS["gemm"], or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


if __name__ == "__main__":  # python -m kernels.cuda.gemm: check, then time, on a GPU (kernels/cuda/bench.py)
    import sys

    from kernels.cuda.bench import main

    sys.exit(main(["--family", "gemm"] + sys.argv[1:]))
