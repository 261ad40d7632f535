"""The projections' pure part: functions of the state alone (read models, the pool view,
the digest, the recheck schedule). No clock, no I/O: ``tests/test_purity.py`` holds the
folder to it."""
