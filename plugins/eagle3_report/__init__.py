"""The EAGLE-3 run report page: locate a run's artifacts, read them, render one HTML page.

`run_files` reads (no web code), `page` renders, `app` is the FastAPI app that
`eagle3_report_plugin.py` mounts in the Airflow api-server under /eagle3.
"""
