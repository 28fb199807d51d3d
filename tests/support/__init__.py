"""What the test modules share: the multi-process harness and the workers its children
run, the bounded polls, fixtures' data and Hypothesis strategies.

Imported as ``support.*``: pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in
``pyproject.toml``), and a spawned child inherits that path, so a worker function is
found by its module's name.
"""
