"""Runnable programs: the tour, training on one device, the incidents, the course's listing.

Only `minipar.cli` imports this package; the layers below never do. Each program prints
through a function it is given (or stdout) and returns what it measured, so tests can
check the figures it prints.
"""
