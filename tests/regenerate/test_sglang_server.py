"""SGLangServer: the command line from SGLang's documented flags, and the lifecycle against a fake
`sglang.launch_server` module (a real subprocess on 127.0.0.1 that serves /health and starts a worker)."""

from __future__ import annotations

import json

import pytest
from regen_helpers import HERE, free_port

from eagle3.errors import InputError
from eagle3.serving import ServerFailed
from eagle3.serving.sglang import SGLangServer, eagle3_speculative
from tests.evaluate.server_processes import alive, wait_dead

FAKE_PATH = str(HERE / "fake_sglang")


def fake(tmp_path, model="/models/m", health="200", **kw) -> SGLangServer:
    env = {"PYTHONPATH": FAKE_PATH, "FAKE_SGLANG_RECORD": str(tmp_path / "record.json"),
           "FAKE_SGLANG_HEALTH": health}
    return SGLangServer(model, port=free_port(), env=env, log_path=str(tmp_path / "server.log"), **kw)


class TestCommand:
    def test_plain(self):
        s = SGLangServer("/models/llama", tp=2, port=31000, python="python")
        assert s.command() == ["python", "-m", "sglang.launch_server", "--model-path", "/models/llama",
                               "--tp-size", "2", "--host", "127.0.0.1", "--port", "31000"]
        assert s.url == "http://127.0.0.1:31000"

    def test_speculative_and_extra_args(self):
        s = SGLangServer("/m", port=1, python="python", speculative=eagle3_speculative("/draft", steps=3),
                         extra_args=["--mem-fraction-static", "0.8"])
        cmd = s.command()
        assert cmd[cmd.index("--speculative-algorithm") + 1] == "EAGLE3"
        assert cmd[cmd.index("--speculative-draft-model-path") + 1] == "/draft"
        assert cmd[cmd.index("--speculative-num-steps") + 1] == "3"
        assert cmd[cmd.index("--speculative-eagle-topk") + 1] == "1"
        assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "4"  # topk 1: steps + 1
        assert cmd[-2:] == ["--mem-fraction-static", "0.8"]

    def test_refuses_managed_flag_in_extra_args(self):
        with pytest.raises(InputError, match="--port"):
            SGLangServer("/m", extra_args=["--port=1"])

    def test_refuses_unknown_speculative_key(self):
        with pytest.raises(InputError, match="num_stepz"):
            SGLangServer("/m", speculative={"num_stepz": 3})

    def test_refuses_too_few_gpus(self):
        with pytest.raises(InputError, match="tp=2 needs at least 2 GPUs"):
            SGLangServer("/m", tp=2, gpus=[0])


class TestLifecycle:
    def test_start_healthy_stop_leaves_no_process(self, tmp_path):
        with fake(tmp_path, tp=2, gpus=[3, 5], speculative=eagle3_speculative("/d")) as server:
            rec = json.loads((tmp_path / "record.json").read_text())
            # The fake parsed exactly the flags we built (argparse would have refused unknown ones).
            assert rec["args"]["model_path"] == "/models/m" and rec["args"]["tp_size"] == 2
            assert rec["args"]["speculative_algorithm"] == "EAGLE3"
            assert rec["cuda_visible_devices"] == "3,5"
            assert server.healthy()
            assert alive(rec["pid"]) and alive(rec["worker_pid"])
        assert wait_dead(rec["pid"]) and wait_dead(rec["worker_pid"]), "server or its worker outlived stop()"
        assert not server.healthy()

    def test_stop_on_error_inside_block(self, tmp_path):
        with pytest.raises(RuntimeError, match="boom"):
            with fake(tmp_path):
                raise RuntimeError("boom")
        rec = json.loads((tmp_path / "record.json").read_text())
        assert wait_dead(rec["pid"]) and wait_dead(rec["worker_pid"])

    def test_exit_before_healthy_raises_with_log(self, tmp_path):
        server = fake(tmp_path, model="EXIT")
        with pytest.raises(ServerFailed, match=r"(?s)exited with code 3.*cannot load model EXIT"):
            with server:
                pass
        assert server.proc is None

    def test_never_healthy_times_out_and_stops(self, tmp_path):
        server = fake(tmp_path, health="503")
        with pytest.raises(ServerFailed, match="not healthy after"):
            server.start()
            try:
                server.wait_healthy(timeout=3)
            finally:
                rec = json.loads((tmp_path / "record.json").read_text())
                server.stop()
        assert wait_dead(rec["pid"]) and wait_dead(rec["worker_pid"])

    def test_stop_is_idempotent(self, tmp_path):
        server = fake(tmp_path).start()
        server.wait_healthy(timeout=30)
        server.stop()
        server.stop()
        assert server.proc is None

    def test_connect_to_running_server(self, tmp_path):
        with fake(tmp_path) as owned:
            handle = SGLangServer.connect(owned.url + "/")
            assert handle.url == owned.url
            handle.wait_healthy(timeout=5)
            handle.stop()  # not ours: must not stop it
            assert owned.healthy()

    def test_connect_refuses_non_url(self):
        with pytest.raises(InputError, match="not an http"):
            SGLangServer.connect("localhost:30000")
