"""Grid-stride indexing shared by the kernels that give each thread one element of an NCHW array.

Such a kernel walks ``t = cuda.grid(1), t + cuda.gridsize(1), ...`` over the flat (row-major)
index of the array it writes, so consecutive threads write consecutive addresses (coalesced
stores), and turns each ``t`` back into the element's four coordinates here.
"""

from numba import cuda


@cuda.jit(device=True)
def unravel_nchw(t, C, H, W):
    """Flat row-major index ``t`` of an (N, C, H, W) array -> its (n, c, h, w)."""
    w = t % W
    h = (t // W) % H
    c = (t // (W * H)) % C
    n = t // (W * H * C)
    return n, c, h, w
