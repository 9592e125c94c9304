"""The contenders room: the contract a contender fulfils (:mod:`attnbench.contenders.contract`), the registry
that loads contenders through the ``attnbench.impls`` entry points, and a contender as it was at another git
revision (``_revision``, for ``attnbench ab --base``).

It imports only the workload and measure rooms and :mod:`attnbench.errors` (import-linter checks it, ``nox -s
lint``). The contenders themselves live in ``impls/`` (``attnbench.impls``), outside ``src/attnbench``: a
revision's package root is found from there.
"""
