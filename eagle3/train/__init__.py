"""EAGLE-3 draft training: the loop (`loop.train`), batches from the store,
atomic checkpoints, the OOM adaptation and the `eagle3 train` CLI."""
