"""The report's table of every row: a DataTables table made by itables in its offline mode.

What the reader gets, all inside the one HTML file (itables embeds its DataTables bundle, base64-encoded;
nothing is fetched): a default set of readable columns (``SHOWN``) with every other results column one
click away (the "Columns" button), filter panes by contender, status, mask, dtype and device
(DataTables SearchPanes), a text search over every column, sorting, and pages of ``PAGE_LENGTH`` rows.

Escaping: itables escapes ``&``, ``<`` and ``>`` in every string cell and column name (its default,
``allow_html=False``), so a contender named ``<script>…</script>`` or an error message with HTML shows as
text; those escaped strings are what the page's JSON carries, so no cell can close its ``<script>``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from itables import to_html_datatable
from itables.javascript import generate_init_offline_itables_html
from itables.options import dt_bundle

from attnbench.workload.axes import case_label, tags

TABLE_ID = "results-table"
PAGE_LENGTH = 25
# Shown by default, in this order; ``shape`` is B, H (/Hkv), S (xSk), D in one readable cell; ``case`` is the
# row's index in its run's results file (what ``attnbench run --from RUN --case N`` takes). ``reproduce``, the
# command that reruns the row's case, is one click away (the "Columns" button), as every other column.
# ``reason`` beside ``status``, one line (ellipsised; the why-missing table above has each reason whole), so a
# row that did not run is as tall as one that did and says why on screen.
SHOWN = [
    "impl",
    "case",
    "shape",
    "mask",
    "pass",
    "dtype",
    "device",
    "status",
    "reason",
    "median_ms",
    "tflops",
    "gbps",
    "pct_of_peak",
    "peak_mem_mb",
    "max_abs_err",
]
FILTERS = ["impl", "status", "mask", "dtype", "device"]  # a SearchPanes pane each
# Shown after ``impl``, and a pane each, where the report holds more than one: two runs' rows of one case
# otherwise look alike but for their medians (the same impl, case number and shape)
SOURCES = ["run", "machine"]
LEFT_OUT = ["samples_ms"]  # raw samples: in results.parquet, too long for a table cell
SIGNIFICANT = 4  # digits kept in float cells (the files keep full precision)


def _shape(row: Any) -> str:
    """'B1 H8/2 S128x256 D64 w48' — the workload label without device, dtype, mask and pass (own columns): its
    four sizes and the feature tags, read from the whole row (a kv_dtype tag only where it differs from the
    dtype, as the CLI's labels show it)."""
    return " ".join(case_label(row).split()[:4]) + tags(row)


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value) else math.nan


def _sources(table: pd.DataFrame) -> list[str]:
    """Those of ``SOURCES`` the table holds more than one of."""
    return [c for c in SOURCES if c in table.columns and table[c].nunique() > 1]


def shown_columns(table: pd.DataFrame) -> list[str]:
    """The columns shown by default: ``SHOWN``, with ``run`` and ``machine`` after ``impl`` where the table holds
    more than one run or machine."""
    return [SHOWN[0], *_sources(table), *SHOWN[1:]]


def table_frame(frame: pd.DataFrame, cases: list[int] | None = None) -> pd.DataFrame:
    """The frame the table shows: :func:`shown_columns` first, then every other column, floats rounded for
    reading. ``cases``: each row's index in the results file it was read from, where that is not its index among
    its run's rows (a merged folder's rows: `run --from MERGED --case N` takes the index in the merged file)."""
    records = frame.to_dict("records")
    table = frame.drop(columns=[c for c in LEFT_OUT if c in frame.columns]).copy()
    table["shape"] = [_shape(r) for r in records]
    # rows of one run are consecutive and in their file's order (load_runs keeps them so)
    if cases is not None:
        table["case"] = cases
    else:
        table["case"] = table.groupby("run", sort=False).cumcount() if "run" in table else range(len(table))
    shown = shown_columns(table)
    rest = [c for c in table.columns if c not in shown]
    table = table[[c for c in shown if c in table.columns] + rest]
    for column in table.columns:
        if pd.api.types.is_float_dtype(table[column]):
            # pandas' nullable Float64: a missing value goes to the page as null, an empty cell (not "NaN")
            table[column] = table[column].map(_round).astype("Float64")
    return table.reset_index(drop=True)


def _options(table: pd.DataFrame) -> dict[str, Any]:
    columns, shown = list(table.columns), shown_columns(table)
    hidden = [i for i, c in enumerate(columns) if c not in shown]
    panes = [columns.index(c) for c in [*_sources(table), *FILTERS] if c in columns]
    reason = [columns.index("reason")] if "reason" in columns else []
    return {
        "table_id": TABLE_ID,
        "connected": False,  # the DataTables bundle is embedded in the page, not fetched
        "display_logo_when_loading": False,
        "maxBytes": 0,  # never downsample: every row is in the table
        "showIndex": False,
        "text_in_header_can_be_selected": False,  # a click anywhere on a heading sorts (not only on its arrow)
        "format_floats_in_python": False,  # numbers go to the page as numbers (sortable), rounded above
        "classes": "display compact cell-border",
        "style": "width:100%;margin:0",
        "pageLength": PAGE_LENGTH,
        "lengthMenu": [10, 25, 50, 100, {"label": "All", "value": -1}],
        "scrollX": True,
        "layout": {
            "top1": "searchPanes",
            "topStart": "buttons",  # itables moves the buttons here unless a layout value is exactly "buttons"
            "topEnd": "search",
            "bottomStart": ["pageLength", "info"],
            "bottomEnd": "paging",
        },
        "buttons": [{"extend": "colvis", "text": "Columns", "columns": ":not(.dtr-control)"}],
        "searchPanes": {
            "columns": panes,
            "cascadePanes": True,
            "viewTotal": True,
            "layout": f"columns-{len(panes)}",
            "threshold": 1.0,  # a pane for every filter column, however many distinct values it has
        },
        "columnDefs": [
            {"targets": hidden, "visible": False},
            {"targets": reason, "className": "reason-cell"},
            {"targets": panes, "searchPanes": {"show": True}},  # also a column with one value (e.g. one dtype)
            {"targets": [columns.index("shape")], "className": "dt-nowrap"},
        ],
    }


def results_table_html(frame: pd.DataFrame, cases: list[int] | None = None) -> tuple[str, str]:
    """(the offline DataTables bundle, to include once, before the table; the table itself) as HTML."""
    table = table_frame(frame, cases)
    return generate_init_offline_itables_html(dt_bundle), to_html_datatable(table, **_options(table))
