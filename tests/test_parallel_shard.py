"""The parameter server's reduce + SGD update sharded over the worker threads (parallel/shard.py):
the fused kernel equals the server's gemv followed by kernels/sgd.py's step, the shards tile the
parameters on cache-line boundaries, and a sharded run trains like the server's own update."""

import numpy as np
import pytest

from kernels import sgd
from minicaffe.parallel import ParallelTrainer
from minicaffe.parallel.shard import ALIGN, BLOCK, ShardPlan, shard_ranges, why_not
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
        plan.run(k, work, weights, w, g, h, 0.01, 0.9, rule == "Nesterov")
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


def test_rules_the_fused_pass_does_not_do_stay_on_the_server(tmp_path):
    for rule in ("AdaGrad", "RMSProp", "AdaDelta", "Adam"):
        fields = {"momentum": 0.0} if rule in ("AdaGrad", "RMSProp") else {}
        reasons = why_not(make_solver(tmp_path, type=rule, **fields), 0, [])
        assert reasons and f"the {rule} rule" in reasons[0], reasons
    assert why_not(make_solver(tmp_path, type="Nesterov"), 0, []) == []
