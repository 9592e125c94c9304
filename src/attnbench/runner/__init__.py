"""The runner room: what runs cases — the run request, the plan and the sweep, worker processes, the
prediction that skips what would not fit, results rows and the run folder, repeats, shards, interrupts, the
A/B of two revisions, and profiling.

It may import every room below it (contenders, workload, measure, errors), never the API, the CLI or the
reports (import-linter checks it, ``nox -s lint``). A subpackage named ``run`` would shadow :func:`attnbench.run`,
hence ``runner``; ``cases`` is the per-case pipeline.
"""
