"""EAGLE-3 draft training: data, extraction, training, export and evaluation.

This package never imports Airflow. Every stage is a plain function that the
`eagle3` CLI and the Airflow operators both call.
"""

__version__ = "0.1.0"
