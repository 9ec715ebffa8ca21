"""Reference solutions to the code exercises (same names as tutorials/exercises/), and
ANSWERS.md for the questions that ask for thought.  Try the exercises first."""
