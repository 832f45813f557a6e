"""A fake `sglang` package for tests: only `python -m sglang.launch_server` exists."""
