"""Airflow operators for the eagle3 pipeline: thin wrappers over the `eagle3` core library."""
