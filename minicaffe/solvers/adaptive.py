"""Adaptive update rules (Caffe's adagrad/rmsprop/adadelta/adam_solver.cpp).

g = the regularized gradient, lr_i = rate * lr_mult_i, eps = ``delta``:

    AdaGrad:   s <- s + g^2 ;                              step = lr_i g / (sqrt(s) + eps)
    RMSProp:   s <- d s + (1 - d) g^2   (d = rms_decay) ;  step = lr_i g / (sqrt(s) + eps)
    AdaDelta:  s <- m s + (1 - m) g^2 ; u = g sqrt(x + eps) / sqrt(s + eps) ;
               x <- m x + (1 - m) u^2 ;                    step = lr_i u        (m = momentum)
    Adam:      a <- b1 a + (1 - b1) g ; b <- b2 b + (1 - b2) g^2 ;
               step = lr_i sqrt(1 - b2^t) / (1 - b1^t) a / (sqrt(b) + eps),  t = iter + 1
                                                            (b1 = momentum, b2 = momentum2)
"""

from ..errors import SolverError
from .solver import Solver


class AdaGradSolver(Solver):
    type = "AdaGrad"

    def check_hyperparameters(self):
        if self.param.momentum != 0:
            raise SolverError("AdaGrad: momentum cannot be used with AdaGrad (set momentum: 0)")

    def compute_update_value(self, i, rate):
        g = self.net.learnable_params[i].dev_flat_diff
        s = self.history[0][i].reshape(-1)
        xp = self.net.xp
        s += g * g
        g[...] = (rate * self.net.params_lr[i]) * g / (xp.sqrt(s) + self.param.delta)


class RMSPropSolver(Solver):
    type = "RMSProp"

    def check_hyperparameters(self):
        if self.param.momentum != 0:
            raise SolverError("RMSProp: momentum cannot be used with RMSProp (set momentum: 0)")
        if not 0 <= self.param.rms_decay <= 1:
            raise SolverError(f"RMSProp: rms_decay must be in [0, 1], got {self.param.rms_decay}")

    def compute_update_value(self, i, rate):
        g = self.net.learnable_params[i].dev_flat_diff
        s = self.history[0][i].reshape(-1)
        d = self.param.rms_decay
        xp = self.net.xp
        s *= d
        s += (1 - d) * g * g
        g[...] = (rate * self.net.params_lr[i]) * g / (xp.sqrt(s) + self.param.delta)


class AdaDeltaSolver(Solver):
    type = "AdaDelta"
    history_names = ("history", "update_history")

    def compute_update_value(self, i, rate):
        g = self.net.learnable_params[i].dev_flat_diff
        s = self.history[0][i].reshape(-1)
        x = self.history[1][i].reshape(-1)
        m, eps = self.param.momentum, self.param.delta
        xp = self.net.xp
        s *= m
        s += (1 - m) * g * g
        u = g * xp.sqrt(x + eps) / xp.sqrt(s + eps)
        x *= m
        x += (1 - m) * u * u
        g[...] = (rate * self.net.params_lr[i]) * u


class AdamSolver(Solver):
    type = "Adam"
    history_names = ("m", "v")

    def compute_update_value(self, i, rate):
        g = self.net.learnable_params[i].dev_flat_diff
        a = self.history[0][i].reshape(-1)
        b = self.history[1][i].reshape(-1)
        b1, b2 = self.param.momentum, self.param.momentum2
        xp = self.net.xp
        a *= b1
        a += (1 - b1) * g
        b *= b2
        b += (1 - b2) * g * g
        g[...] = (rate * self.net.params_lr[i] * self.bias_correction()) * a / (xp.sqrt(b) + self.param.delta)

    def bias_correction(self):
        """sqrt(1 - b2^t) / (1 - b1^t) at this iteration (t = iter + 1): on the rate."""
        b1, b2, t = self.param.momentum, self.param.momentum2, self.iter + 1
        return (1 - b2**t) ** 0.5 / (1 - b1**t)
