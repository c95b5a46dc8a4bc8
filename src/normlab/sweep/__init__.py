"""Sweeps of runs, built on normlab.run and entered only through Hydra's callbacks: a multirun
job's place in its sweep (jobs: reused, locked, resumed, its row), the sweep's
summary.csv/summary.md (summary), the Hydra callbacks around multiruns and their jobs
(callbacks: exit codes) and several multiruns run in turn in one process (multiruns). A run
itself is normlab.run. Importing this package loads neither torch nor Lightning (its callbacks
run before them)."""
