"""attnbench.reports: everything made from finished runs.

``frames`` loads run folders and pytest-benchmark files into one pandas schema; ``summary`` prints the
table at the end of a run; ``plots`` draws the seaborn figures; ``html`` writes the self-contained report
page (``build`` ties loading, figures and page together for ``attnbench report``); ``compare`` gives a
verdict per case between two runs; ``ratios`` judges one contender against its peers within a run;
``merge`` joins shards and runs from several machines into one results set.
"""
