"""attnbench.reports: everything made from finished runs (the top of the rooms but the CLI: it may import the
core, the core never imports it).

Loading and the page: ``frames`` loads run folders and pytest-benchmark files into one pandas schema;
``summary`` prints the table at the end of a run, its ``fastest`` column (and the report's headline) from
``ranking``, which names a winner only beyond the noise (a case in several runs of one machine ``pooled`` per
contender first); ``plots`` draws the seaborn figures, laid out by ``facets``
and ``figure_layout``; ``table`` is the report's table of every row; ``html`` writes the self-contained report
page, and ``build`` ties loading, figures and page together for ``attnbench report`` (into a folder
``out_folder`` claims: new, empty or an earlier report's, cleared).

Comparing: ``compare`` gives a verdict per case between two runs, dividing out the machine's ``drift`` and
judged against the ``noise_floor`` history has seen; ``normalise`` divides times by the matching yardstick;
``ratios`` judges one contender against its peers within a run; ``merge`` joins shards and runs from several
machines into one results set.

Over many runs: ``store`` keeps every run in one DuckDB file; ``history`` draws each case's trend (``trend``)
and the steps ``changes`` finds in it.

A/B in one process: ``ab_command`` is the ``attnbench ab`` command (the timing itself is
``attnbench.runner.ab``), ``ab_report`` its table, CSV and figure.

Before any run: ``masks`` is the ``attnbench masks`` command, how each workload's mask falls on a kernel's tiles
(``attnbench.workload.tiles`` counts them), as a table and a picture.

Calibration (``nox -s calibrate``): ``calibrate`` prints one table of the three answers to "is it slower?",
from ``calibrate_ab`` (ab's false alarms and detections) and ``calibrate_runs`` (compare and history).
"""
