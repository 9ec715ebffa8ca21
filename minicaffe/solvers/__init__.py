"""Solvers: Caffe's training loop and its update rules, with pycaffe's names.

``get_solver(path)`` builds the solver the prototxt's ``type`` names (default SGD);
``SGDSolver(path)`` etc. build one directly.
"""

from ..errors import SolverError, did_you_mean
from .adaptive import AdaDeltaSolver, AdaGradSolver, AdamSolver, RMSPropSolver
from .sgd import NesterovSolver, SGDSolver
from .solver import Solver, load_solver_param

SOLVERS = {
    cls.type: cls for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver, AdamSolver)
}


def solver_class(type_name):
    cls = SOLVERS.get(type_name)
    if cls is None:
        raise SolverError(f"unknown solver type '{type_name}'." + did_you_mean(type_name, SOLVERS, "solver types"))
    return cls


def get_solver(path, **kwargs):
    """The solver that ``path`` (a solver prototxt or a SolverParameter) asks for, by its ``type``."""
    param, _ = load_solver_param(path)
    return solver_class(param.type)(path, **kwargs)


__all__ = [
    "Solver",
    "SGDSolver",
    "NesterovSolver",
    "AdaGradSolver",
    "RMSPropSolver",
    "AdaDeltaSolver",
    "AdamSolver",
    "get_solver",
    "SOLVERS",
]
