"""Lesson 06's corpus: answers a learner writes, each a patch of solution.py."""

from minipar.course.corpus import right, wrong

WRONG = []
RIGHT = []
