"""minicaffe's course: numbered lessons (percent-format scripts), their exercises and checker.

python tutorials/01_blobs_layers.py      run a lesson as a script
python -m tutorials.check 05             check your answers to lesson 5's exercises
python -m tutorials.render               render every lesson, with outputs and figures
"""
