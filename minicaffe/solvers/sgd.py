"""SGD with momentum and Nesterov's accelerated gradient (Caffe's sgd_solver.cpp, nesterov_solver.cpp).

With g = the regularized gradient (``param.diff``), lr_i = rate * lr_mult_i, m = momentum:

    SGD:       v <- m v + lr_i g ;            w <- w - v
    Nesterov:  v' <- m v + lr_i g ;           w <- w - ((1 + m) v' - m v)
"""

from .solver import Solver


class SGDSolver(Solver):
    type = "SGD"

    def update_parameter(self, i, rate):
        """With L2 decay the whole step is one fused kernel pass (kernels/sgd.py); else Caffe's steps."""
        f = self.update_fields
        if f.regularization_type != "L2":
            return super().update_parameter(i, rate)
        p = self.net.learnable_params[i]
        self.normalize(i)
        decay = f.weight_decay * self.net.params_weight_decay[i]
        self.net.backend.sgd_step(
            p.dev_flat_data,
            p.dev_flat_diff,
            self.history[0][i].reshape(-1),
            f.momentum,
            rate * self.net.params_lr[i],
            decay,
        )

    def compute_update_value(self, i, rate):
        p = self.net.learnable_params[i]
        local_rate = rate * self.net.params_lr[i]
        h = self.history[0][i].reshape(-1)
        g = p.dev_flat_diff
        h *= self.update_fields.momentum
        h += local_rate * g
        g[...] = h


class NesterovSolver(Solver):
    type = "Nesterov"

    def compute_update_value(self, i, rate):
        p = self.net.learnable_params[i]
        local_rate = rate * self.net.params_lr[i]
        m = self.param.momentum
        h = self.history[0][i].reshape(-1)
        g = p.dev_flat_diff
        previous = h.copy()
        h *= m
        h += local_rate * g
        g[...] = (1.0 + m) * h - m * previous
