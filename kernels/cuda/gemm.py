"""GEMM on the GPU: c = alpha * op(a) @ op(b) + beta * c, a ladder from one thread per element to
register-blocked, double-buffered, vectorized kernels, against cuBLAS.

Contract: the CPU family's (``kernels/gemm.py``): op(a) (M, K), op(b) (K, N), c (M, N)
C-contiguous; beta == 0 means c is not read; c may alias a or b (the input is copied first).
Each wrapper takes the launcher ``L`` first.  Checked against the CPU file's float64
``gemm_reference``.  v1 and v2 are handed the transposed *views* (numba indexes any strides; a
transposed operand is then read across its rows and those loads do not coalesce); v3 to v5
are built once per pair of transposes and read a and b as stored, always along their
contiguous axis.

Versions (thread mapping in each kernel's docstring), each meant to be faster than the one above:
  cublas        ``xp.matmul``: cuBLAS on CuPy arrays (in the simulator numpy's BLAS stands in,
                so the engine's code path is the same); the CPU family's ``vendor_gemm`` and
                ``check_operands``, shared.  The baseline, and the default.
  v1_naive      one thread per element of c, K multiply-adds from global memory: each element of
                a and b is loaded M or N times over; only the caches save it.
  v2_tiled      16 x 16 blocks stage 16 x 16 tiles of op(a) and op(b) in shared memory: global
                traffic drops 16x.  Still one shared load per FMA, so shared-memory bandwidth
                and load instructions cap it.
  v3_regblock   register blocking: a 256-thread block computes a 128 x 128 tile of c, each thread
                8 x 8 of it in registers.  Per k a thread loads 8 values of a and 8 of b from
                shared memory for 64 FMAs (4 FMAs per load instead of 1), from an a-tile stored
                transposed (k-major) so that both are row reads.  Thread (tx, ty) owns rows
                ty + 16 r and columns tx + 16 s: a half-warp reads 16 consecutive floats of the
                b-tile (16 banks) and one of the a-tile (a broadcast), no bank conflicts.  The
                global loads coalesce for every transpose pair; edge tiles are zero-filled when
                loaded, so the inner loop has no bounds test.  ptxas: at most 128 registers (two
                blocks, 16 warps, per SM), no spills, for every transpose pair.
  v4_double_buffered  v3 with two shared stages: the loads of slice k + 1 are issued into
                registers before slice k's FMAs and stored into the other stage after them, so
                global latency hides behind arithmetic, and one barrier per slice replaces two.
  v5_vectorized v4 with the shared tiles as arrays of 4-float records, which numba aligns to
                16 bytes: each thread's 8 + 8 values per k come in 4 ``ld.shared.v4`` instead of
                16 scalar loads (and the tiles are stored with ``st.shared.v4``), so FMAs go from
                v4's 70% to 84% of the inner loop's instructions (ptxas, sm_90).  A thread owns two
                groups of 4 adjacent rows and of 4 adjacent columns (4 ty + 64 g + v): a
                quarter-warp's eight 16-byte loads are 128 consecutive bytes, no bank conflict.

Every blocked rung's inner loop takes k two at a time (``for h in range(2)``, unrolled): numba's
range loop costs about 16 instructions of 64-bit bookkeeping per pass, which this halves.

Why the previous top rung (64 x 64 tile, 4 x 4 per thread) ran slower than v2_tiled on an H200
(6.3 against 7.7 TFLOP/s at 4096^3; cuBLAS 51), read from its PTX: the loop over k was a
real loop whose body held 16 FMAs, 8 shared loads and 42 instructions of 64-bit index
arithmetic: numba's negative-index fix-up (a compare and a select per subscript, since it
could not prove the indices non-negative) kept every address from folding into its load, so
FMAs were a quarter of the instructions issued.  The 4 x 4 blocking gave only 2 FMAs per shared
load, b-tile reads were 2-way bank conflicted and a-tile stores 8-way, and 127 registers
(for 16 accumulators: the rest held 64-bit addresses) allowed two 256-thread blocks per SM,
the occupancy v3 now reaches with 64 accumulators per thread.  The fixes, each visible in the
PTX and asserted by tests/test_cuda_gemm_ladder.py: subscripts are unsigned (``U``) where they are known to be
non-negative, which drops the fix-up and lets the offsets fold (``ld.shared.f32 [%rd+64]``);
8 x 8 blocking (4 FMAs per shared load); the strided thread layout and padded shared rows
(no bank conflicts); ``beta == 0`` decided when the kernel is built (tested per element it
cost 100 registers).  v3 and v4 keep scalar shared loads: numba aligns a float32 shared array
to 4 bytes only, so the compiler cannot merge four into an ``ld.shared.v4``; v5 gets the
alignment from a 16-byte record type.

Tile sizes are compile-time constants (``make_*`` build one kernel per size, cached), so loops
over a tile unroll; the simulator runs the same source with small tiles (``_launch.SIM_CONFIG``).
"""

import functools

import numpy as np
from numba import cuda

from .. import _versions
from ..gemm import check_operands, gemm_reference, vendor_gemm  # noqa: F401  (gemm_reference: for the tests)

__all__ = [
    "gemm",
    "VERSIONS",
    "DEFAULTS",
    "use",
    "make_tiled",
    "make_regblock",
    "make_double_buffered",
    "make_vectorized",
]


#: index with an unsigned integer: numba then skips its negative-index fix-up (a compare and a select
#: per subscript), and the compiler can fold an unrolled loop's offsets into the load instruction
#: (``ld.shared.f32 [%rd+64]``): v3's old inner loop spent more instructions on that than on FMAs
U = np.uint64


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


# -- v3 and v4: register blocking, then double buffering --------------------------------------------
def _check_blocking(BM, BN, BK, TM, TN):
    """The shapes the register-blocked kernels can take (they are compile-time constants: a
    wrong one is an error at kernel-build time, never a wrong product)."""
    TY, TX = BM // TM, BN // TN
    NT = TX * TY
    ok = (
        BM % TM == 0
        and BN % TN == 0
        and all(v > 0 and v & (v - 1) == 0 for v in (BM, BN, BK))  # powers of two: // and % are shifts
        and BK >= 2  # step() takes k two at a time
        and NT % BM == 0
        and NT % BN == 0
        and NT % BK == 0
        and (BM * BK) % NT == 0
        and (BN * BK) % NT == 0
    )
    if not ok:
        raise ValueError(
            f"register blocking BM,BN,BK,TM,TN = {BM},{BN},{BK},{TM},{TN}: needs BM, BN, BK powers of two (BK >= 2), "
            f"TM | BM, TN | BN, and the {NT} threads dividing BM, BN, BK, BM*BK and BN*BK"
        )
    return TY, TX, NT


@functools.cache
def _tile_parts(BM, BN, BK, TM, TN, ta, tb, beta0):
    """The device functions v3 and v4 share, for one tile shape and one pair of transposes
    (compile-time constants, so every loop below has a constant trip count and unrolls, and every
    branch on ``ta`` / ``tb`` is decided when the kernel is built).

    Shared tiles: ``As[stage, k, m]`` = op(a)[row0 + m, k0 + k] -- op(a)'s tile stored
    *transposed* (k-major), so that the compute step reads a row of it -- and
    ``Bs[stage, k, n]`` = op(b)[k0 + k, col0 + n].  Each row is padded by ``PAD`` elements: when
    consecutive threads load consecutive k (an operand whose rows run along k), they store down a
    column of the tile, and without the pad 32 // BK of them would hit each bank.

    fetch: global -> registers.  Thread t loads LA elements of op(a)'s BM x BK tile and LB of
      op(b)'s BK x BN tile into ``ra`` / ``rb``, consecutive threads at consecutive addresses of
      the operand *as stored* (so along k for a non-transposed a, along m for a transposed one):
      every warp's load coalesces, whatever the transposes.  Outside the matrices it loads 0, so
      edge tiles need no test anywhere else.
    stash: registers -> shared stage ``st``.
    step: the BK outer products of one tile from shared stage ``st`` into the TM x TN
      accumulators: per k, TM values of As (a row, held in ``af``) and TN of Bs (``bf``) for TM*TN
      FMAs.  Thread (tx, ty) owns rows ty + TY*r and columns tx + TX*s of the block's tile
      (strided, not a contiguous TM x TN patch): the 16 threads of a half-warp then read 16
      consecutive Bs elements (16 banks, no conflict) and all share one As element (a
      broadcast), and the same layout makes C's stores coalesce.
    write: C = alpha acc + beta C, inside the matrix.  ``beta0`` (beta == 0: C is not read) is
      a build-time constant too: tested per element at run time, it cost the kernel about 100
      registers (ptxas: 230 instead of 123), and with them half its occupancy.
    """
    TY, TX, NT = _check_blocking(BM, BN, BK, TM, TN)
    LA, LB = BM * BK // NT, BN * BK // NT  # elements each thread moves per tile
    PAD = max(1, 32 // BK)

    @cuda.jit(device=True)
    def fetch(a, b, M, N, K, row0, col0, k0, t, ra, rb):
        zero = ra.dtype.type(0)
        for q in range(LA):
            if ta:  # a stored (K, M): consecutive threads along m
                m, k = t % BM, t // BM + q * (NT // BM)
                i, p = row0 + m, k0 + k
                ra[q] = a[U(p), U(i)] if (i < M and p < K) else zero
            else:  # a stored (M, K): consecutive threads along k
                m, k = t // BK + q * (NT // BK), t % BK
                i, p = row0 + m, k0 + k
                ra[q] = a[U(i), U(p)] if (i < M and p < K) else zero
        for q in range(LB):
            if tb:  # b stored (N, K): along k
                n, k = t // BK + q * (NT // BK), t % BK
                j, p = col0 + n, k0 + k
                rb[q] = b[U(j), U(p)] if (j < N and p < K) else zero
            else:  # b stored (K, N): along n
                n, k = t % BN, t // BN + q * (NT // BN)
                j, p = col0 + n, k0 + k
                rb[q] = b[U(p), U(j)] if (j < N and p < K) else zero

    @cuda.jit(device=True)
    def stash(As, Bs, st, t, ra, rb):
        for q in range(LA):
            if ta:
                As[U(st), U(t // BM + q * (NT // BM)), U(t % BM)] = ra[q]
            else:
                As[U(st), U(t % BK), U(t // BK + q * (NT // BK))] = ra[q]
        for q in range(LB):
            if tb:
                Bs[U(st), U(t % BK), U(t // BK + q * (NT // BK))] = rb[q]
            else:
                Bs[U(st), U(t // BN + q * (NT // BN)), U(t % BN)] = rb[q]

    @cuda.jit(device=True)
    def step(As, Bs, st, tx, ty, acc, af, bf):
        for k2 in range(BK // 2):  # two k per pass: the loop's own bookkeeping is paid half as often
            for h in range(2):
                k = 2 * k2 + h
                for r in range(TM):
                    af[r] = As[U(st), U(k), U(ty + TY * r)]
                for s in range(TN):
                    bf[s] = Bs[U(st), U(k), U(tx + TX * s)]
                for r in range(TM):
                    for s in range(TN):
                        acc[r, s] += af[r] * bf[s]

    @cuda.jit(device=True)
    def write(alpha, beta, C, row0, col0, tx, ty, acc):
        M, N = C.shape
        for r in range(TM):
            i = row0 + ty + TY * r
            for s in range(TN):
                j = col0 + tx + TX * s
                if i < M and j < N:
                    if beta0:
                        C[U(i), U(j)] = alpha * acc[r, s]
                    else:
                        C[U(i), U(j)] = alpha * acc[r, s] + beta * C[U(i), U(j)]

    return TY, TX, LA, LB, BM + PAD, BN + PAD, fetch, stash, step, write


@functools.cache
def make_regblock(BM, BN, BK, TM, TN, ta=False, tb=False, beta0=False):
    """v3: kernel(alpha, a, b, beta, C) for a and b *as stored* (op() by ``ta`` / ``tb``)."""
    TY, TX, LA, LB, SA, SB, fetch, stash, step, write = _tile_parts(BM, BN, BK, TM, TN, ta, tb, beta0)

    @cuda.jit
    def gemm_regblock(alpha, a, b, beta, C):
        """Block (TX, TY) = (BN/TN, BM/TM) owns a BM x BN tile of C (tiles grid-strided); thread
        (tx, ty) keeps TM x TN accumulators in registers.  Per BK-slice of K: fetch the two tiles
        into registers (all LA + LB loads in flight at once), stash them in shared memory, sync,
        BK outer-product steps, sync (before the next stash overwrites the tiles)."""
        As = cuda.shared.array((1, BK, SA), dtype=C.dtype)
        Bs = cuda.shared.array((1, BK, SB), dtype=C.dtype)
        acc = cuda.local.array((TM, TN), dtype=C.dtype)
        af = cuda.local.array(TM, dtype=C.dtype)
        bf = cuda.local.array(TN, dtype=C.dtype)
        ra = cuda.local.array(LA, dtype=C.dtype)
        rb = cuda.local.array(LB, dtype=C.dtype)
        M, N = C.shape
        K = a.shape[0] if ta else a.shape[1]
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
                    fetch(a, b, M, N, K, row0, col0, k0, t, ra, rb)
                    stash(As, Bs, 0, t, ra, rb)
                    cuda.syncthreads()
                    step(As, Bs, 0, tx, ty, acc, af, bf)
                    cuda.syncthreads()
                write(alpha, beta, C, row0, col0, tx, ty, acc)

    return gemm_regblock


@functools.cache
def make_double_buffered(BM, BN, BK, TM, TN, ta=False, tb=False, beta0=False):
    """v4: v3 with two shared stages and the next tile's loads in flight during this tile's math."""
    TY, TX, LA, LB, SA, SB, fetch, stash, step, write = _tile_parts(BM, BN, BK, TM, TN, ta, tb, beta0)

    @cuda.jit
    def gemm_double_buffered(alpha, a, b, beta, C):
        """As v3, with stages 0 and 1 of As / Bs.  Before the loop: fetch + stash slice 0 into
        stage 0, sync.  Per slice: issue the loads of slice k0 + BK into registers (they take
        hundreds of cycles to arrive), do this slice's BK outer products from stage ``st``
        meanwhile, stash the registers into the other stage, one sync, swap stages.  The stage
        being written was last read one slice earlier, before that slice's sync: one barrier per
        slice instead of v3's two, and the memory latency hides behind the FMAs."""
        As = cuda.shared.array((2, BK, SA), dtype=C.dtype)
        Bs = cuda.shared.array((2, BK, SB), dtype=C.dtype)
        acc = cuda.local.array((TM, TN), dtype=C.dtype)
        af = cuda.local.array(TM, dtype=C.dtype)
        bf = cuda.local.array(TN, dtype=C.dtype)
        ra = cuda.local.array(LA, dtype=C.dtype)
        rb = cuda.local.array(LB, dtype=C.dtype)
        M, N = C.shape
        K = a.shape[0] if ta else a.shape[1]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * TX + tx
        zero = C.dtype.type(0)
        for row0 in range(cuda.blockIdx.y * BM, M, cuda.gridDim.y * BM):
            for col0 in range(cuda.blockIdx.x * BN, N, cuda.gridDim.x * BN):
                for r in range(TM):
                    for s in range(TN):
                        acc[r, s] = zero
                fetch(a, b, M, N, K, row0, col0, 0, t, ra, rb)
                stash(As, Bs, 0, t, ra, rb)
                cuda.syncthreads()
                st = 0
                for k0 in range(0, K, BK):
                    more = k0 + BK < K
                    if more:
                        fetch(a, b, M, N, K, row0, col0, k0 + BK, t, ra, rb)
                    step(As, Bs, st, tx, ty, acc, af, bf)
                    if more:
                        stash(As, Bs, 1 - st, t, ra, rb)
                    cuda.syncthreads()
                    st = 1 - st
                write(alpha, beta, C, row0, col0, tx, ty, acc)

    return gemm_double_buffered


# -- v5: v4 with float4 fragments ------------------------------------------------------------------------
@functools.cache
def _quad(dtype):
    """A record of four ``dtype`` values: numba aligns a shared array of it to the record's size
    (16 bytes for float32), so four adjacent loads of one record become one ``ld.shared.v4``."""
    import numba

    d = np.dtype(dtype)
    return numba.from_dtype(np.dtype([("x", d), ("y", d), ("z", d), ("w", d)]))


@functools.cache
def make_vectorized(BM, BN, BK, TM, TN, ta=False, tb=False, beta0=False, dtype=np.float32):
    """v5: kernel(alpha, a, b, beta, C) -- v4 with the shared tiles held as 4-element records."""
    TY, TX, NT = _check_blocking(BM, BN, BK, TM, TN)
    if TM % 4 or TN % 4 or (BM * BK) % (4 * NT) or (BN * BK) % (4 * NT):
        raise ValueError(
            f"vectorized blocking BM,BN,BK,TM,TN = {BM},{BN},{BK},{TM},{TN}: needs TM and TN multiples of 4 "
            f"and each of the {NT} threads moving whole groups of 4 per tile"
        )
    Q = _quad(dtype)
    QA, QB = BM * BK // (4 * NT), BN * BK // (4 * NT)  # records each thread moves per tile
    LA, LB = 4 * QA, 4 * QB
    SA, SB = BM // 4 + 1, BN // 4 + 1  # a tile row in records, plus one: see stash
    GM, GN = TM // 4, TN // 4  # record groups per thread

    @cuda.jit(device=True)
    def coords(e, rows, contiguous_rows):
        """Record e of a tile with ``rows`` rows (m or n) and BK columns: (row group g, k).
        Consecutive e run along the operand's contiguous axis, as stored."""
        if contiguous_rows:
            return e % (rows // 4), e // (rows // 4)
        return e // BK, e % BK

    @cuda.jit(device=True)
    def fetch(a, b, M, N, K, row0, col0, k0, t, ra, rb):
        """Global -> registers: thread t loads QA groups of 4 consecutive rows of op(a) at one k
        (and QB of op(b)'s columns), 0 outside the matrices."""
        zero = ra.dtype.type(0)
        for q in range(QA):
            g, k = coords(t + q * NT, BM, ta)
            p = k0 + k
            for v in range(4):
                i = row0 + 4 * g + v
                ok = i < M and p < K
                if ta:
                    ra[4 * q + v] = a[U(p), U(i)] if ok else zero
                else:
                    ra[4 * q + v] = a[U(i), U(p)] if ok else zero
        for q in range(QB):
            g, k = coords(t + q * NT, BN, not tb)
            p = k0 + k
            for v in range(4):
                j = col0 + 4 * g + v
                ok = j < N and p < K
                if tb:
                    rb[4 * q + v] = b[U(j), U(p)] if ok else zero
                else:
                    rb[4 * q + v] = b[U(p), U(j)] if ok else zero

    @cuda.jit(device=True)
    def stash(As, Bs, st, t, ra, rb):
        """Registers -> shared: one record (one ``st.shared.v4``) per group.  A row of the tile is
        padded by one record: where consecutive threads hold consecutive k, a quarter-warp's
        eight 16-byte stores then fall in eight different bank groups."""
        for q in range(QA):
            g, k = coords(t + q * NT, BM, ta)
            As[U(st), U(k), U(g)]["x"] = ra[4 * q]
            As[U(st), U(k), U(g)]["y"] = ra[4 * q + 1]
            As[U(st), U(k), U(g)]["z"] = ra[4 * q + 2]
            As[U(st), U(k), U(g)]["w"] = ra[4 * q + 3]
        for q in range(QB):
            g, k = coords(t + q * NT, BN, not tb)
            Bs[U(st), U(k), U(g)]["x"] = rb[4 * q]
            Bs[U(st), U(k), U(g)]["y"] = rb[4 * q + 1]
            Bs[U(st), U(k), U(g)]["z"] = rb[4 * q + 2]
            Bs[U(st), U(k), U(g)]["w"] = rb[4 * q + 3]

    @cuda.jit(device=True)
    def step(As, Bs, st, tx, ty, acc, af, bf):
        """Per k: GM records of As and GN of Bs (one 16-byte load each) for TM*TN FMAs.  Thread
        (tx, ty) owns rows 4 ty + 4 TY g + v and columns 4 tx + 4 TX g + v (v < 4): a
        quarter-warp's eight records are 128 consecutive bytes (no bank conflict), and the As
        record is shared by the half-warp (a broadcast)."""
        for k2 in range(BK // 2):
            for h in range(2):
                k = 2 * k2 + h
                for g in range(GM):
                    q = As[U(st), U(k), U(g * TY + ty)]
                    af[4 * g], af[4 * g + 1], af[4 * g + 2], af[4 * g + 3] = q["x"], q["y"], q["z"], q["w"]
                for g in range(GN):
                    q = Bs[U(st), U(k), U(g * TX + tx)]
                    bf[4 * g], bf[4 * g + 1], bf[4 * g + 2], bf[4 * g + 3] = q["x"], q["y"], q["z"], q["w"]
                for r in range(TM):
                    for s in range(TN):
                        acc[r, s] += af[r] * bf[s]

    @cuda.jit(device=True)
    def write(alpha, beta, C, row0, col0, tx, ty, acc):
        M, N = C.shape
        for r in range(TM):
            i = row0 + (r // 4) * 4 * TY + 4 * ty + r % 4
            for s in range(TN):
                j = col0 + (s // 4) * 4 * TX + 4 * tx + s % 4
                if i < M and j < N:
                    if beta0:
                        C[U(i), U(j)] = alpha * acc[r, s]
                    else:
                        C[U(i), U(j)] = alpha * acc[r, s] + beta * C[U(i), U(j)]

    @cuda.jit
    def gemm_vectorized(alpha, a, b, beta, C):
        """v4's schedule (two stages, the next slice's loads in flight during this slice's FMAs,
        one barrier per slice) with ``fetch`` / ``stash`` / ``step`` above."""
        As = cuda.shared.array((2, BK, SA), dtype=Q)
        Bs = cuda.shared.array((2, BK, SB), dtype=Q)
        acc = cuda.local.array((TM, TN), dtype=C.dtype)
        af = cuda.local.array(TM, dtype=C.dtype)
        bf = cuda.local.array(TN, dtype=C.dtype)
        ra = cuda.local.array(LA, dtype=C.dtype)
        rb = cuda.local.array(LB, dtype=C.dtype)
        M, N = C.shape
        K = a.shape[0] if ta else a.shape[1]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * TX + tx
        zero = C.dtype.type(0)
        for row0 in range(cuda.blockIdx.y * BM, M, cuda.gridDim.y * BM):
            for col0 in range(cuda.blockIdx.x * BN, N, cuda.gridDim.x * BN):
                for r in range(TM):
                    for s in range(TN):
                        acc[r, s] = zero
                fetch(a, b, M, N, K, row0, col0, 0, t, ra, rb)
                stash(As, Bs, 0, t, ra, rb)
                cuda.syncthreads()
                st = 0
                for k0 in range(0, K, BK):
                    more = k0 + BK < K
                    if more:
                        fetch(a, b, M, N, K, row0, col0, k0 + BK, t, ra, rb)
                    step(As, Bs, st, tx, ty, acc, af, bf)
                    if more:
                        stash(As, Bs, 1 - st, t, ra, rb)
                    cuda.syncthreads()
                    st = 1 - st
                write(alpha, beta, C, row0, col0, tx, ty, acc)

    return gemm_vectorized


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


def _launch_blocked(L, make, trans_a, trans_b, alpha, a, b, beta, c):
    A, B, al, be = _prepare(L, trans_a, trans_b, alpha, a, b, beta, c)
    BM, BN, BK, TM, TN = L.config.regblock
    if c.size:
        # the kernels read a and b as stored (A.T undoes the view _prepare made), one build per
        # pair of transposes, so each reads its operands along their contiguous axis
        kernel = make(BM, BN, BK, TM, TN, bool(trans_a), bool(trans_b), beta == 0)
        grid = L.grid2d(c.shape[0], c.shape[1], BM, BN)
        L.launch(kernel, grid, (BN // TN, BM // TM), al, A.T if trans_a else A, B.T if trans_b else B, be, c)


def gemm_v3_regblock(L, trans_a, trans_b, alpha, a, b, beta, c):
    _launch_blocked(L, make_regblock, trans_a, trans_b, alpha, a, b, beta, c)


def gemm_v4_double_buffered(L, trans_a, trans_b, alpha, a, b, beta, c):
    _launch_blocked(L, make_double_buffered, trans_a, trans_b, alpha, a, b, beta, c)


def gemm_v5_vectorized(L, trans_a, trans_b, alpha, a, b, beta, c):
    _launch_blocked(L, functools.partial(make_vectorized, dtype=c.dtype.type), trans_a, trans_b, alpha, a, b, beta, c)


VERSIONS = {
    "gemm": {
        "cublas": gemm_cublas,
        "v1_naive": gemm_v1_naive,
        "v2_tiled": gemm_v2_tiled,
        "v3_regblock": gemm_v3_regblock,
        "v4_double_buffered": gemm_v4_double_buffered,
        "v5_vectorized": gemm_v5_vectorized,
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
