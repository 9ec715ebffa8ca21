"""Your answers to the lessons' code exercises: one file per lesson, each function a stub to
replace.  Check them with ``python -m tutorials.check NN`` (or ``NN.k`` for one)."""
