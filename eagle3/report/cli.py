"""Write a DAG run's report: RUN/report/{report.json, *.png, report.html, reuse.json} and RUN/run_summary.json.

  eagle3 report --root ARTIFACTS --dag-id eagle3_train --run-id manual__2026-12-01T05:04:34
"""

from eagle3.config import stage_cli
from eagle3.report import ReportConfig, report

add_arguments, run = stage_cli(ReportConfig, report)
