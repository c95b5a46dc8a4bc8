"""Where runs run: a run dir held by one run (rundir), resuming a run (resume), a multirun job's
identity (identity) and place in its sweep (jobs: reused, locked, resumed), the sweep's
summary.csv/summary.md (summary), the Hydra callbacks around runs, jobs and multiruns
(callbacks: exit codes), the task function of train.py (task) and several multiruns run in
turn in one process (multiruns). A run itself is normlab.run.train. Importing this package
loads neither torch nor Lightning (its callbacks run before them)."""
