"""The parameter server's reduce + SGD update sharded over the worker threads (parallel/shard.py):
the fused kernel equals the server's gemv followed by kernels/sgd.py's step, the shards tile the
parameters on cache-line boundaries, and a sharded run trains like the server's own update."""

import numpy as np
import pytest

from kernels import sgd
from minicaffe.parallel import ParallelTrainer
from minicaffe.parallel.shard import ALIGN, BLOCK, Rule, ShardPlan, shard_ranges, why_not
from tests.test_parallel import assert_params_close, dataset, make_solver, no_worker_threads, params_of  # noqa: F401

COUNTS = [500, 20, 2 * BLOCK + 7, 50, 5 * BLOCK + 3, 10]  # segments cross blocks and shards


def problem(n, seed=0):
    rng = np.random.default_rng(seed)
    P = sum(COUNTS)
    grads = rng.standard_normal((n, P)).astype(np.float32)
    weights = (np.arange(1, n + 1) / np.arange(1, n + 1).sum()).astype(np.float32)
    w = rng.standard_normal(P).astype(np.float32)
    h = rng.standard_normal(P).astype(np.float32)
    offsets = list(np.cumsum([0] + COUNTS[:-1]))
    lr_mults = [1.0, 2.0] * (len(COUNTS) // 2)
    decays = [5e-4 * d for d in [1.0, 0.0] * (len(COUNTS) // 2)]
    return grads, weights, w, h, offsets, lr_mults, decays


def the_servers_update(grads, weights, w, h, offsets, lr_mults, decays, rate, momentum):
    """What the server does without shards: one gemv, then sgd_step per parameter."""
    g = np.zeros_like(w)
    g += grads[0] if len(grads) == 1 else np.dot(weights, grads)
    for off, cnt, lr, d in zip(offsets, COUNTS, lr_mults, decays):
        s = slice(off, off + cnt)
        sgd.sgd_step(w[s], g[s], h[s], momentum, rate * lr, d)
    return g


def the_servers_nesterov(grads, weights, w, h, offsets, lr_mults, decays, rate, momentum):
    """solvers/sgd.py's NesterovSolver after the server's gemv: regularize, the rule, w -= diff;
    returns the diffs (the update value)."""
    g = np.zeros_like(w)
    g += grads[0] if len(grads) == 1 else np.dot(weights, grads)
    for off, cnt, lr, d in zip(offsets, COUNTS, lr_mults, decays):
        s = slice(off, off + cnt)
        if d:
            g[s] += d * w[s]
        previous = h[s].copy()
        h[s] *= momentum
        h[s] += rate * lr * g[s]
        g[s] = (1.0 + momentum) * h[s] - momentum * previous
        w[s] -= g[s]
    return g


def rule_of(rule, **hyper):
    """shard.Rule of a solver of type ``rule`` with these hyperparameters (the rest Caffe's defaults)."""

    from types import SimpleNamespace

    param = SimpleNamespace(**{"momentum": 0.0, "momentum2": 0.999, "rms_decay": 0.99, "delta": 1e-8, **hyper})
    return Rule(SimpleNamespace(type=rule, param=param))


@pytest.mark.parametrize("rule", ["SGD", "Nesterov"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_fused_sharded_update_equals_the_servers(n, rule):
    grads, weights, w, h, offsets, lr_mults, decays = problem(n)
    w_ref, h_ref = w.copy(), h.copy()
    server = the_servers_update if rule == "SGD" else the_servers_nesterov
    g_ref = server(grads, weights, w_ref, h_ref, offsets, lr_mults, decays, 0.01, 0.9)
    plan = ShardPlan(offsets, COUNTS, lr_mults, decays, n)
    g = np.full_like(w, np.nan)
    work = grads.copy()
    for k in range(n):
        plan.run(k, work, weights, w, g, [h], rule_of(rule, momentum=0.9), 0.01)
    np.testing.assert_array_equal(work, grads)  # the workers' gradients are only read
    if n == 1:  # the same arithmetic in the same order
        np.testing.assert_array_equal(g, g_ref)
        np.testing.assert_array_equal(w, w_ref)
        np.testing.assert_array_equal(h, h_ref)
    # n > 1: the sum's order may differ from the gemv's by an ulp
    np.testing.assert_allclose(g, g_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w, w_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(h, h_ref, rtol=1e-6, atol=1e-6)
    if rule == "SGD":  # against float64 arithmetic
        g64 = (weights.astype(np.float64)[:, None] * grads).sum(axis=0)
        np.testing.assert_allclose(g, g64, rtol=1e-5, atol=1e-6)


def test_shards_tile_the_parameters_on_cache_lines():
    for count in (1, 15, 17, 1000, 431080):
        for n in (1, 2, 3, 4):
            r = shard_ranges(count, n)
            assert r[0][0] == 0 and r[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(r, r[1:]))
            assert all(lo % ALIGN == 0 or lo == count for lo, _ in r)
            sizes = [hi - lo for lo, hi in r]
            assert max(sizes) - min(sizes) <= ALIGN or count < n * ALIGN
    grads, weights, w, h, offsets, lr_mults, decays = problem(2)
    plan = ShardPlan(offsets, COUNTS, lr_mults, decays, 3)
    cuts = np.concatenate([b for b in plan.bounds])
    assert cuts[0] == 0 and cuts[-1] == sum(COUNTS)
    # every segment lies inside one parameter, with that parameter's multipliers
    for b, mults in zip(plan.bounds, plan.lr_mults):
        for s in range(len(b) - 1):
            i = int(np.searchsorted(offsets, b[s], side="right")) - 1
            assert b[s + 1] <= offsets[i] + COUNTS[i] and mults[s] == lr_mults[i]


@pytest.mark.parametrize("rule", ["SGD", "Nesterov"])
@pytest.mark.parametrize("n", [2, 3])
def test_a_sharded_run_trains_as_the_servers_update(tmp_path, n, rule):
    serial = make_solver(tmp_path, type=rule)
    serial.step(6)
    runs = {}
    for shard in (True, False):
        par = make_solver(tmp_path, type=rule)
        with ParallelTrainer(par, n, shard_update=shard) as trainer:
            trainer.step(3)
            trainer.step(3)  # a second run of the same trainer, on the same (parked) threads
        assert trainer.sharded is shard and par.iter == 6
        runs[shard] = (params_of(par), [p.diff.copy() for p in par.net.learnable_params], trainer.stats())
    assert_params_close(params_of(serial), runs[True][0])
    assert_params_close(runs[False][0], runs[True][0], rtol=1e-5, atol=1e-6)
    # the solver net's diffs hold the reduced gradient afterwards, as with the server's update
    assert_params_close(runs[False][1], runs[True][1], rtol=1e-5, atol=1e-6)
    s = runs[True][2]
    assert all(u > 0 for u in s["worker_update"]) and s["server_reduce"] >= 0
    assert no_worker_threads(trainer)


def test_where_the_sharded_update_does_not_apply_the_server_updates(tmp_path):
    lines = []
    for fields, why in (
        ({"clip_gradients": 0.5}, "clip_gradients"),
        ({"regularization_type": "L1"}, "regularization_type L1"),
        ({"iter_size": 2}, "iter_size"),
    ):
        serial = make_solver(tmp_path, **fields)
        serial.step(3)
        par = make_solver(tmp_path, log=lines.append, **fields)
        trainer = ParallelTrainer(par, 2)
        trainer.step(3)
        assert not trainer.sharded and why in "; ".join(trainer.why_not_sharded)
        assert any("reduce + update on the server" in line and why in line for line in lines), lines
        assert_params_close(params_of(serial), params_of(par))


ADAPTIVE = {
    "AdaGrad": {"momentum": 0.0, "base_lr": 0.05},
    "RMSProp": {"momentum": 0.0, "rms_decay": 0.9, "base_lr": 0.01},
    "AdaDelta": {"momentum": 0.95, "delta": 1e-6, "base_lr": 1.0},
    "Adam": {"momentum": 0.9, "momentum2": 0.999, "delta": 1e-8, "base_lr": 0.01},
}


def histories(solver):
    return [h.copy() for hist in solver.history for h in hist]


@pytest.mark.parametrize("rule", list(ADAPTIVE))
def test_one_worker_updates_with_an_adaptive_rule_as_the_server_bit_for_bit(tmp_path, rule):
    """reduce_adaptive writes solvers/adaptive.py's float32 expressions in numpy's order: one
    worker's sharded update (a reduce by weight 1) equals one thread's Solver exactly (the
    parameters, both history vectors, and the diffs, which hold the update value)."""
    serial = make_solver(tmp_path, type=rule, **ADAPTIVE[rule])
    serial.step(4)
    par = make_solver(tmp_path, type=rule, **ADAPTIVE[rule])
    with ParallelTrainer(par, 1) as trainer:
        trainer.step(4)
    assert trainer.sharded, trainer.why_not_sharded
    for x, y in zip(params_of(serial) + histories(serial), params_of(par) + histories(par)):
        np.testing.assert_array_equal(x, y)
    for p, q in zip(serial.net.learnable_params, par.net.learnable_params):
        np.testing.assert_array_equal(p.diff, q.diff)


@pytest.mark.parametrize("rule", list(ADAPTIVE))
def test_workers_update_with_an_adaptive_rule_as_the_server(tmp_path, rule):
    """2 workers, the sharded update against the server's own on the same gradients (up to the
    order of the sum); lr_mult 2 on the bias and weight decay are in.  (Not against one thread:
    AdaGrad's first step is about lr sign(g), so an ulp of difference in a gradient near zero,
    from summing the shards in another order, moves a weight by far more than an ulp (2.4e-4
    after these 5 steps); the server's own update on 2 workers' gradients differs from one
    thread exactly as much.)"""
    runs = {}
    for shard in (True, False):
        par = make_solver(tmp_path, type=rule, **ADAPTIVE[rule])
        with ParallelTrainer(par, 2, shard_update=shard) as trainer:
            trainer.step(2)
            trainer.step(3)
        assert trainer.sharded is shard and par.iter == 5
        runs[shard] = params_of(par) + histories(par)
    assert_params_close(runs[False], runs[True], rtol=1e-4, atol=1e-6)


def test_an_adaptive_kernel_equals_numpy_on_segments_across_blocks():
    """reduce_adaptive on 3 shards of COUNTS (segments that cross blocks and shards, lr_mult and
    decay per segment, a zero decay skipped) against the Solver's numpy lines, for each rule."""
    for rule, fields in ADAPTIVE.items():
        grads, weights, w, h, offsets, lr_mults, decays = problem(3, seed=2)
        s = np.abs(h) if rule != "Adam" else h.copy()  # sums of squares are >= 0
        x = np.abs(h[::-1]).copy()
        hyper = {"momentum": 0.0, "momentum2": 0.999, "rms_decay": 0.99, "delta": 1e-8, **fields}
        w_ref, s_ref, x_ref = w.copy(), s.copy(), x.copy()
        g_ref = np.dot(weights, grads)
        rate, corr = 0.01, (1 - 0.999**3) ** 0.5 / (1 - 0.9**3) if rule == "Adam" else 1.0
        m, eps = hyper["momentum"], hyper["delta"]
        for off, cnt, lr, d in zip(offsets, COUNTS, lr_mults, decays):
            sl = slice(off, off + cnt)
            g, ss, xx, lr_i = g_ref[sl], s_ref[sl], x_ref[sl], rate * lr
            if d:
                g += d * w_ref[sl]
            if rule == "AdaGrad":
                ss += g * g
                g[...] = lr_i * g / (np.sqrt(ss) + eps)
            elif rule == "RMSProp":
                dec = hyper["rms_decay"]
                ss *= dec
                ss += (1 - dec) * g * g
                g[...] = lr_i * g / (np.sqrt(ss) + eps)
            elif rule == "AdaDelta":
                ss *= m
                ss += (1 - m) * g * g
                u = g * np.sqrt(xx + eps) / np.sqrt(ss + eps)
                xx *= m
                xx += (1 - m) * u * u
                g[...] = lr_i * u
            else:
                b2 = hyper["momentum2"]
                ss *= m
                ss += (1 - m) * g
                xx *= b2
                xx += (1 - b2) * g * g
                g[...] = (lr_i * corr) * ss / (np.sqrt(xx) + eps)
            w_ref[sl] -= g
        plan = ShardPlan(offsets, COUNTS, lr_mults, decays, 3)
        g = np.full_like(w, np.nan)
        for k in range(3):
            plan.run(k, grads, weights, w, g, [s, x], rule_of(rule, **hyper), rate, corr)
        for name, got, want in (("g", g, g_ref), ("w", w, w_ref), ("s", s, s_ref), ("x", x, x_ref)):
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, err_msg=f"{rule}: {name}")


def test_rules_with_l1_stay_on_the_server(tmp_path):
    for rule, fields in ADAPTIVE.items():
        assert why_not(make_solver(tmp_path, type=rule, **fields), 0, []) == []
        reasons = why_not(make_solver(tmp_path, type=rule, regularization_type="L1", **fields), 0, [])
        assert reasons and "regularization_type L1" in reasons[0], reasons
    assert why_not(make_solver(tmp_path, type="Nesterov"), 0, []) == []
