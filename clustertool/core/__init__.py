"""Foundations: the model, errors, state on disk, node sets, YAML, signals, hostfiles, job paths.

They import nothing above them (tests/unit/test_imports.py checks the layer order)."""
