"""eagle3.devices.passive_thread_waits: idle OpenMP workers sleep in `eagle3 train` (docs/train.md "Speed")."""

from __future__ import annotations

import subprocess
import sys

from eagle3.devices import THREAD_WAIT_ENV, passive_thread_waits


def test_sets_only_what_is_unset():
    assert passive_thread_waits({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert passive_thread_waits({"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_train_command_sets_it():
    # `eagle3 train` with a missing store fails as bad input (exit 2), after setting the env of its process.
    code = ("import os, sys; from eagle3 import cli; os.environ.pop('OMP_WAIT_POLICY', None); "
            "rc = cli.main(['train', '--store', '/nonexistent', '--vocab', '/nonexistent', '--out', '/tmp/x']); "
            "print(os.environ.get('OMP_WAIT_POLICY'), rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == [THREAD_WAIT_ENV["OMP_WAIT_POLICY"], "2"], out.stderr[-2000:]
