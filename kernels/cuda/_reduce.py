"""The one block reduction every GPU kernel here uses (softmax's block-per-row kernels, the
loss kernels' partial sums).

``block_reduce(red, v, take_max)``: every thread of the block passes its value ``v``; every
thread gets back the block's sum (or maximum).  ``red`` is a shared array of one element per
thread, allocated by the calling kernel (a shared array's size must be a compile-time
constant, so kernels that use this are built per block size by a ``make_*`` factory).  The
block size must be a power of two.

The tree: step s = T/2, T/4, ..., 1 folds element tid + s into tid for tid < s, with a
``syncthreads`` between steps (log2 T of them).  The trailing ``syncthreads`` lets every thread
read the result before a caller's next reduction reuses ``red``.  Warp shuffles
(``shfl_down_sync``) would save the shared-memory round trips of the last five steps, but
numba's CUDA simulator does not implement them, and every kernel here must run in it.
"""

from numba import cuda


@cuda.jit(device=True)
def block_reduce(red, v, take_max):
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            other = red[tid + s]
            if take_max:
                if other > red[tid]:
                    red[tid] = other
            else:
                red[tid] += other
        cuda.syncthreads()
        s //= 2
    r = red[0]
    cuda.syncthreads()
    return r
