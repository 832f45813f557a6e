"""The report stage: one report per DAG run (plots, report.html) and the run summary the UI page reads.

``report(ReportConfig) -> summary``; ``write_report(out, ...)`` renders from explicit paths. The
run's folders come from :mod:`eagle3.layout`; the work is in :mod:`eagle3.report.stage`. What a report
says is :mod:`eagle3.report.collect`'s (read from the run's files) and :mod:`eagle3.report.view`'s (the texts
and tables), shared with the Airflow UI's report tab.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.report.collect import training_curves
from eagle3.report.stage import write_report  # light: matplotlib loads inside


@dataclass(frozen=True)
class ReportConfig:
    root: str
    """The storage root the run wrote under (eagle3.layout)."""
    dag_id: str
    """The DAG's id."""
    run_id: str
    """The DAG run's id."""
    task_states: tuple[dict, ...] | None = None
    """The run's other tasks at report time, ``[{"task_id", "map_index", "state"}]`` (the Airflow operator
    passes them), so the report names what failed or was skipped; None: only the kept errors are known."""


def report(cfg: ReportConfig) -> dict:
    """Write RUN/report/ from the run's stage outputs and RUN/run_summary.json; returns the report summary."""
    from eagle3.report.stage import run

    return run(cfg)


__all__ = ["ReportConfig", "report", "training_curves", "write_report"]
