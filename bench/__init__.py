"""The benchmark of issue 7: sessionrepo against the raw drivers and the peer session
stores, on the same workload, database server and durability settings.

Run ``python -m bench`` (or ``make bench``); ``python -m bench --quick`` is a smoke test.
"""
