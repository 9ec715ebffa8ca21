"""The parameter server's reduce and the Solver's update, sharded across the worker threads.

With one server thread, every clock ends with the server alone on one core: it sums the N
workers' gradient vectors (G = sum_k w_k G_k), runs the Solver's update (SGD with momentum and
L2 decay: h = m h + lr (G + decay W), W -= h) and only then lets the workers start the next
clock; the other cores wait.  Both steps are elementwise over the flat vectors, so they split
by *position*: worker k owns the contiguous range [lo_k, hi_k) of W, G, the history h and every
G_j, and once all N gradients of a clock are in, each worker runs, on its range only::

    for each block of 1024 values:                 (in the L1 cache while it is worked on)
        G  = w_0 G_0                               (the reduce)
        G += w_j G_j  (j >= 1)
        h  = m h + lr_i (G + decay_i W)            (kernels/sgd.py's sgd_step, the same
        W -= h                                       float32 expression, lr_i per parameter)

The adaptive rules (solvers/adaptive.py) are one sweep each too, with their own history
vectors (``reduce_adaptive``): after the same reduce and L2 decay, per value::

    AdaGrad   s += g g;                      u = lr_i g / (sqrt(s) + eps)
    RMSProp   s = d s + (1 - d) g g;         u = lr_i g / (sqrt(s) + eps)
    AdaDelta  s = m s + (1 - m) g g;  v = g sqrt(x + eps) / sqrt(s + eps);
              x = m x + (1 - m) v v;         u = lr_i v
    Adam      a = b1 a + (1 - b1) g;  b = b2 b + (1 - b2) g g;
                                             u = lr_i c_t a / (sqrt(b) + eps)
    G = u;  W -= u

each written as solvers/adaptive.py writes it with numpy on float32 arrays (the same operations
in the same order, each rounded to float32), so one worker's update equals the server's bit for
bit; Adam's bias correction c_t is the Solver's (``AdamSolver.bias_correction``), published
with the iteration's rate.

One sweep over (N + 3) vectors (SGD) instead of the server's gemv and its update; N cores share it.
The ranges are cut at multiples of 16 values (64 bytes, one cache line), so two workers never
write the same line.  A range that crosses parameters is split into *segments*, one per
parameter, each with its own lr_mult and decay_mult.  The G_j are only read: each worker zeroes
its own at the start of its next clock, in its own core's cache, where its backward then adds to
them (zeroing them here, on the core of another worker, was measured: it moved half of every
G_j's cache lines to the other core each step, and each worker's step cost ~0.9 ms more CPU).

Where it applies (ParallelTrainer decides, see ``why_not``): the CPU backend, BSP, any of the
six rules with L2 regularization, no gradient clipping (it needs the norm of the whole G before
any update), iter_size 1, no custom updater, and no callback that reads the gradients between
the reduce and the update (``on_gradients_ready``).  Elsewhere the server reduces and updates
as before.
"""

import numpy as np
from numba import njit

#: values per block: the reduce and the update of one block stay in the L1 cache
BLOCK = 1024
#: shard boundaries are multiples of this many values (64 bytes of float32: one cache line)
ALIGN = 16


@njit(nogil=True, cache=True)
def reduce_sgd(grads, weights, w, g, h, bounds, lr_mults, decays, rate, momentum, nesterov=False):
    """The fused reduce + SGD step over segments [bounds[s], bounds[s+1]) of the flat vectors.

    grads: (N, P) the workers' gradients, read only; weights: (N,) their b_k / B;
    w, h: (P,) parameters and momentum, updated; g: (P,) written with the reduced gradient (the
    solver net's diffs: what the serial path leaves there); lr_mults, decays: per segment;
    rate: the solver's learning rate (float64, multiplied out as the Solver does).
    ``nesterov``: Nesterov's step instead (solvers/sgd.py's NesterovSolver, the same float32
    expression): v = m h + lr (G + decay W); u = (1 + m) v - m h; h = v; W -= u; g holds u
    afterwards, as the Solver leaves the update value in the diffs."""
    t = w.dtype.type
    m = t(momentum)
    m1 = t(1.0 + momentum)
    n = grads.shape[0]
    for s in range(bounds.size - 1):
        a = t(rate * lr_mults[s])
        d = t(decays[s])
        for b0 in range(bounds[s], bounds[s + 1], BLOCK):
            b1 = min(b0 + BLOCK, bounds[s + 1])
            # slices, indexed from 0: numba then knows no index is negative and LLVM
            # vectorizes the loops (indexing w[i] from b0 kept them scalar, 6x slower)
            gb, wb, hb = g[b0:b1], w[b0:b1], h[b0:b1]
            g0, w0 = grads[0, b0:b1], weights[0]
            for i in range(gb.size):
                gb[i] = w0 * g0[i]
            for k in range(1, n):
                gk, wk = grads[k, b0:b1], weights[k]
                for i in range(gb.size):
                    gb[i] += wk * gk[i]
            if nesterov:
                for i in range(gb.size):
                    wi, hi = wb[i], hb[i]
                    v = m * hi + a * (gb[i] + d * wi)
                    u = m1 * v - m * hi
                    hb[i] = v
                    gb[i] = u
                    wb[i] = wi - u
                continue
            for i in range(gb.size):
                wi = wb[i]
                v = m * hb[i] + a * (gb[i] + d * wi)
                hb[i] = v
                wb[i] = wi - v


#: the adaptive rules' codes in ``reduce_adaptive`` (numba takes the rule as an int)
ADAGRAD, RMSPROP, ADADELTA, ADAM = 1, 2, 3, 4
ADAPTIVE = {"AdaGrad": ADAGRAD, "RMSProp": RMSPROP, "AdaDelta": ADADELTA, "Adam": ADAM}


@njit(nogil=True, cache=True)
def reduce_adaptive(grads, weights, w, g, s, x, bounds, lr_mults, decays, rule, rate, correction, hyper):
    """The fused reduce + an adaptive rule's step over segments [bounds[j], bounds[j+1]).

    grads, weights, w, bounds, lr_mults, decays as in ``reduce_sgd``; g: (P,) written with the
    update value (what the Solver leaves in the diffs); s: the first history vector (AdaGrad's
    and RMSProp's sum of squares, AdaDelta's, Adam's first moment), x: the second (AdaDelta's
    update history, Adam's second moment; ignored by AdaGrad and RMSProp); ``rule``: ADAGRAD,
    RMSPROP, ADADELTA or ADAM; ``rate``: the iteration's learning rate; ``correction``: Adam's
    bias correction (1 for the others); ``hyper``: (momentum, momentum2, rms_decay, delta) as
    float64.  Every float32 operation is the one numpy does in solvers/adaptive.py."""
    t = w.dtype.type
    m, eps = hyper[0], t(hyper[3])
    if rule == RMSPROP:
        m = hyper[2]
    m2 = hyper[1]
    keep, fresh = t(m), t(1.0 - m)  # s = keep s + fresh g g (RMSProp: d, 1 - d; Adam: b1, 1 - b1)
    keep2, fresh2 = t(m2), t(1.0 - m2)  # Adam's b = b2 b + (1 - b2) g g
    n = grads.shape[0]
    for j in range(bounds.size - 1):
        a = t(rate * lr_mults[j] * correction)  # (rate * lr_mult) * c_t in float64, as the Solver
        d = decays[j]
        for b0 in range(bounds[j], bounds[j + 1], BLOCK):
            b1 = min(b0 + BLOCK, bounds[j + 1])
            gb, wb, sb, xb = g[b0:b1], w[b0:b1], s[b0:b1], x[b0:b1]
            g0, w0 = grads[0, b0:b1], weights[0]
            for i in range(gb.size):
                gb[i] = w0 * g0[i]
            for k in range(1, n):
                gk, wk = grads[k, b0:b1], weights[k]
                for i in range(gb.size):
                    gb[i] += wk * gk[i]
            if d != 0.0:  # Solver.regularize: diff += decay * data (skipped at decay 0)
                dd = t(d)
                for i in range(gb.size):
                    gb[i] += dd * wb[i]
            if rule == ADAGRAD:
                for i in range(gb.size):
                    gi = gb[i]
                    si = sb[i] + gi * gi
                    sb[i] = si
                    gb[i] = a * gi / (np.sqrt(si) + eps)
            elif rule == RMSPROP:
                for i in range(gb.size):
                    gi = gb[i]
                    si = sb[i] * keep
                    si += fresh * gi * gi
                    sb[i] = si
                    gb[i] = a * gi / (np.sqrt(si) + eps)
            elif rule == ADADELTA:
                for i in range(gb.size):
                    gi = gb[i]
                    si = sb[i] * keep
                    si += fresh * gi * gi
                    sb[i] = si
                    v = gi * np.sqrt(xb[i] + eps) / np.sqrt(si + eps)
                    xi = xb[i] * keep
                    xi += fresh * v * v
                    xb[i] = xi
                    gb[i] = a * v
            else:  # ADAM
                for i in range(gb.size):
                    gi = gb[i]
                    ai = sb[i] * keep
                    ai += fresh * gi
                    sb[i] = ai
                    bi = xb[i] * keep2
                    bi += fresh2 * gi * gi
                    xb[i] = bi
                    gb[i] = a * ai / (np.sqrt(bi) + eps)
            for i in range(gb.size):  # Solver.update_parameter: data -= diff
                wb[i] -= gb[i]


class Rule:
    """What the fused pass needs of a Solver's rule: ``type``, ``code`` (0: SGD/Nesterov, else
    an ADAPTIVE code), ``momentum`` and ``hyper`` = (momentum, momentum2, rms_decay, delta)."""

    def __init__(self, solver):
        p = solver.param
        self.type = solver.type
        self.code = ADAPTIVE.get(solver.type, 0)
        self.momentum = p.momentum
        self.hyper = np.array([p.momentum, p.momentum2, p.rms_decay, p.delta], dtype=np.float64)

    @staticmethod
    def correction(solver):
        """This iteration's factor on the rate besides lr_mult: Adam's bias correction, else 1."""
        correct = getattr(solver, "bias_correction", None)
        return correct() if correct is not None else 1.0


def shard_ranges(count, n):
    """``n`` contiguous ranges covering range(count), cut at multiples of ALIGN, near-equal."""
    cuts = [min(count, ALIGN * round(count * k / n / ALIGN)) for k in range(n + 1)]
    cuts[0], cuts[-1] = 0, count
    return [(cuts[k], cuts[k + 1]) for k in range(n)]


def rates_and_decays(solver):
    """Each parameter's lr_mult and its L2 decay (the solver's weight_decay times the parameter's
    decay_mult), as tuples: what a ShardPlan needs of the solver besides the layout."""
    wd = solver.param.weight_decay  # (read once: a message field costs ~3 us a read)
    return tuple(solver.net.params_lr), tuple(wd * d for d in solver.net.params_weight_decay)


class ShardPlan:
    """Each worker's segments: ``bounds[k]`` (int64 cuts), ``lr_mults[k]``, ``decays[k]``."""

    def __init__(self, offsets, counts, lr_mults, decays, n):
        total = sum(counts)
        self.ranges = shard_ranges(total, n)
        self.bounds, self.lr_mults, self.decays = [], [], []
        for lo, hi in self.ranges:
            cuts, mults, decs = [lo], [], []
            for off, cnt, lr, dec in zip(offsets, counts, lr_mults, decays):
                a, b = max(lo, off), min(hi, off + cnt)
                if a < b:
                    if cuts[-1] != a:  # cannot happen: parameters tile [0, total)
                        raise AssertionError("parameter layout has a gap")
                    cuts.append(b)
                    mults.append(float(lr))
                    decs.append(float(dec))
            self.bounds.append(np.array(cuts, dtype=np.int64))
            self.lr_mults.append(np.array(mults, dtype=np.float64))
            self.decays.append(np.array(decs, dtype=np.float64))

    def run(self, k, grads, weights, w, g, history, rule, rate, correction=1.0):
        """Worker ``k``'s share of one clock's reduce and ``rule``'s update (a Rule); ``history``:
        the Solver's history vectors, flat; ``correction``: ``Rule.correction`` of the iteration."""
        b, lr, dec = self.bounds[k], self.lr_mults[k], self.decays[k]
        if rule.code == 0:
            reduce_sgd(grads, weights, w, g, history[0], b, lr, dec, rate, rule.momentum, rule.type == "Nesterov")
        else:
            x = history[1] if len(history) > 1 else history[0]  # (AdaGrad, RMSProp: not read)
            reduce_adaptive(grads, weights, w, g, history[0], x, b, lr, dec, rule.code, rate, correction, rule.hyper)


#: the Solver types whose update the fused pass does
RULES = ("SGD", "Nesterov") + tuple(ADAPTIVE)


def why_not(solver, staleness, callbacks_reading_gradients):
    """Why the sharded update cannot stand in for ``solver``'s (a list of reasons; empty: it can)."""
    p, net = solver.param, solver.net
    why = []
    if net.xp is not np:
        why.append(f"the {net.backend.name} backend (the sharded update is a CPU kernel)")
    if staleness:
        why.append("SSP (workers do not wait for the update)")
    if solver.type not in RULES:
        why.append(f"the {solver.type} rule (the fused pass does {', '.join(RULES)})")
    elif p.regularization_type != "L2":
        why.append(f"regularization_type {p.regularization_type} (the fused step does L2)")
    if p.clip_gradients >= 0:
        why.append("clip_gradients (needs the whole gradient's norm before any update)")
    if max(1, int(p.iter_size)) != 1:
        why.append("iter_size > 1")
    if solver.customized:
        why.append(f"a custom {' and '.join(solver.customized)}")
    if callbacks_reading_gradients:
        why.append(f"callbacks reading the gradients before the update ({', '.join(callbacks_reading_gradients)})")
    return why
