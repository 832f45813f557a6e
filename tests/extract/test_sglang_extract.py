"""The sglang extract engine (eagle3.extract.sglang_engine) against a fake SGLang server.

No SGLang runs here (no GPU, no CPU build on PyPI), so the server is tests/evaluate/fake_sglang_server.py:
it parses SGLang's flags (a misspelt one fails) and answers /generate with REAL numbers from a transformers
model, shaped as SGLang's source defines them (tests/evaluate/fake_sglang_states.py). The oracles are
independent of the engine's conversion code: the HF model's own ``output_hidden_states`` and logits, and the
transformers engine's store of the same samples. Bounds per compute precision (the fake runs the model in
the server's --dtype, the policy's choice, like SGLang):

- aux, against HF fp32 ``hidden_states[i + 1]``: fp8 rounding (e4m3: 3 mantissa bits, a row's relative error
  ~2-3%) in fp32; in bf16 also the bf16 forward's own error;
- aux, against the transformers engine's store: the same samples through the same codec, so in fp32 what is
  left is two fp32 forwards' summation orders under fp8 rounding; in bf16 two independent bf16 forwards
  (the lean forward keeps an fp32 residual, HF's a bf16 one);
- top-k ids, against HF fp32 logits: equal except near-ties (adjacent log-probs within NEAR_TIE); log-probs
  within fp16 rounding (|x| 2^-11) in fp32, plus the bf16 logits' error in bf16.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle3.devices import resolve_precision
from eagle3.errors import InputError
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore
from eagle3.serving import ServerFailed
from tests.evaluate.server_processes import alive
from tests.extract.extract_testdata import REPO, cli_env, make_samples, write_merged
from tests.train.train_helpers import peaked_copy

pytestmark = pytest.mark.precision
FAKE_DIR = REPO / "tests" / "evaluate"
AUX_LAYERS = (1, 3, 5)
# measured 2026-12-03 (this file's data): aux vs HF 3.3% / 3.5% (fp32 / bf16), vs the transformers store 0.12% /
# 5.0%; log-probs vs HF fp32 within fp16 rounding / 0.28 (the transformers engine's bf16: 0.18)
AUX_ORACLE_REL = {"float32": 0.05, "bfloat16": 0.05}
AUX_ENGINE_REL = {"float32": 0.01, "bfloat16": 0.08}
NEAR_TIE = {"float32": 1e-4, "bfloat16": 0.6}
LOGPROB_ABS = {"float32": 0.0, "bfloat16": 0.4}  # beyond fp16 rounding


@pytest.fixture
def fake_sglang(monkeypatch, tmp_path):
    """Point the engine at the fake server; returns the file its argv and pid are logged to."""
    monkeypatch.setenv("EAGLE3_SGLANG_MODULE", "fake_sglang_server")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_SGLANG_ARGV_LOG", str(log))
    return log


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_llama_dir) -> dict:
    root = tmp_path_factory.mktemp("sglang")
    target = peaked_copy(tiny_llama_dir, root / "target", scale=40.0)  # real gaps between the top log-probs
    merged = write_merged(root / "merged", make_samples(12, seed=5, max_len=40))
    return {"root": root, "target": target, "merged": merged}


def _extract(data, out, engine, **kw) -> dict:
    return extract(ExtractConfig(merged=data["merged"], model=data["target"], out=str(out), engine=engine,
                                 storage_option="fp8-topk", aux_layers=AUX_LAYERS, device="cpu", **kw))


def _rows_rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Relative error per row and aux layer: ||a - b|| / ||b|| over each [H] block."""
    h = a.shape[-1] // 3
    a, b = a.reshape(-1, 3, h).float(), b.reshape(-1, 3, h).float()
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


def _topk_agrees(ids, lps, ref_logprobs: torch.Tensor, precision: str) -> None:
    """Stored top-k against reference log-probs [T, V]: the same top-k ids except near-ties (each stored id is
    among the reference's best k within NEAR_TIE, and in the reference's order within NEAR_TIE), and the
    log-probs within fp16 rounding of the reference's (plus LOGPROB_ABS in bf16)."""
    k, eps = ids.shape[-1], NEAR_TIE[precision]
    at = ref_logprobs.gather(1, ids.long())  # the reference log-prob of every stored id
    kth = ref_logprobs.topk(k, dim=-1).values[:, -1:]
    assert (at >= kth - eps).all(), f"a stored id is not among the reference's top {k}: {(kth - at).max()}"
    assert (at[:, :-1] >= at[:, 1:] - eps).all(), "stored ids are not in the reference's order"
    assert all(len(set(row)) == k for row in ids.tolist()), "a token id repeats in a row"
    bound = at.abs() * 2.0 ** -11 + LOGPROB_ABS[precision] + 1e-6
    assert ((lps.float() - at).abs() <= bound).all(), (lps.float() - at).abs().max()


def test_the_sglang_store_equals_the_transformers_store_and_the_models_own_numbers(data, fake_sglang):
    precision = resolve_precision("auto", "cpu").name
    ours = _extract(data, data["root"] / "store-sglang", "sglang", requests_in_flight=4)
    theirs = _extract(data, data["root"] / "store-transformers", "transformers")
    assert Path(ours["store"]).name == Path(theirs["store"]).name  # the same store key: train cannot tell
    assert ours["engine"]["name"] == "sglang" and ours["tokens"] == theirs["tokens"] > 0
    s, t = HiddenStateStore(ours["store"]), HiddenStateStore(theirs["store"])
    assert sorted(s.sample_ids()) == sorted(t.sample_ids())
    assert s.engines(s.sample_ids()) == {"sglang": ours["tokens"]}
    assert json.loads((Path(ours["store"]) / "store.json").read_text())["engine"]["name"] == "sglang"

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(data["target"], dtype=torch.float32).eval()
    worst = {"oracle": 0.0, "engine": 0.0}
    for sid in s.sample_ids():
        a, b = s.get(sid), t.get(sid)
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        with torch.no_grad():
            out = model(input_ids=a["input_ids"].long()[None], output_hidden_states=True)
        ref_aux = torch.cat([out.hidden_states[i + 1][0] for i in AUX_LAYERS], dim=-1)  # outputs of layers i
        worst["oracle"] = max(worst["oracle"], _rows_rel(a["aux"], ref_aux).max().item())
        worst["engine"] = max(worst["engine"], _rows_rel(a["aux"], b["aux"]).max().item())
        # row t of the store: the distribution position t predicts (token t + 1)
        ref = torch.log_softmax(out.logits[0].float(), -1)
        _topk_agrees(a["topk_ids"], a["topk_logprobs"], ref, precision)
        _stores_agree(a, b, ref, precision)
    assert worst["oracle"] <= AUX_ORACLE_REL[precision], worst
    assert worst["engine"] <= AUX_ENGINE_REL[precision], worst


def _stores_agree(a: dict, b: dict, ref_logprobs: torch.Tensor, precision: str) -> None:
    """Two stores' top-k of one sample: the same ids except near-ties (an id only one store kept is within
    NEAR_TIE of the reference's k-th best), and the shared ids' log-probs within one fp16 step (plus
    LOGPROB_ABS in bf16)."""
    k, eps = a["topk_ids"].shape[-1], NEAR_TIE[precision]
    kth = ref_logprobs.topk(k, dim=-1).values[:, -1]
    for t, (x, y) in enumerate(zip(a["topk_ids"].tolist(), b["topk_ids"].tolist())):
        for only in set(x) ^ set(y):
            assert ref_logprobs[t, only] >= kth[t] - eps, (t, only, float(kth[t] - ref_logprobs[t, only]))
        lx = dict(zip(x, a["topk_logprobs"][t].float().tolist()))
        ly = dict(zip(y, b["topk_logprobs"][t].float().tolist()))
        for i in set(x) & set(y):
            assert abs(lx[i] - ly[i]) <= abs(ly[i]) * 2.0 ** -10 + LOGPROB_ABS[precision] + 1e-6, (t, i, lx[i], ly[i])


def test_server_flags_capture_draft_and_process_cleanup(data, fake_sglang, tmp_path, monkeypatch):
    """SGLang's flags as its argparse takes them (the fake refuses unknown ones), the parallelism and
    quantization passed through, the capture draft's aux ids, and no process or temp file left by close()."""
    monkeypatch.setenv("FAKE_SGLANG_CHILD", str(tmp_path / "child.pid"))
    summary = _extract(data, tmp_path / "store", "sglang", tensor_parallel_size=2, data_parallel_size=2,
                       quantization="fp8", server_args=("--mem-fraction-static", "0.8"), precision="float32")
    (run,) = [json.loads(line) for line in fake_sglang.read_text().splitlines()]
    argv = run["argv"]
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--model-path"] == data["target"] and pairs["--tp-size"] == "2" and pairs["--dp-size"] == "2"
    assert pairs["--quantization"] == "fp8" and pairs["--dtype"] == "float32"
    assert pairs["--mem-fraction-static"] == "0.8" and pairs["--chunked-prefill-size"] == "-1"
    assert "--enable-fp32-lm-head" in argv
    assert {"--enable-return-hidden-states", "--disable-radix-cache"} <= set(argv)
    assert pairs["--speculative-algorithm"] == "EAGLE3" and pairs["--speculative-num-steps"] == "1"
    draft = Path(pairs["--speculative-draft-model-path"])
    assert not draft.exists()  # removed by close(); what it held is checked by the fake at start (ids, shapes)
    assert summary["engine"] == {"name": "sglang", "version": "unknown", "tensor_parallel_size": 2,
                                 "data_parallel_size": 2, "quantization": "fp8"}
    child = int((tmp_path / "child.pid").read_text().split()[0])
    assert not alive(run["pid"]) and not alive(child), "the server or its child outlived close()"


def test_capture_draft_names_the_store_layers_in_sglangs_convention(data, tmp_path):
    from eagle3.export import load_exported_draft, write_capture_draft
    from eagle3.target import read_config

    shapes = write_capture_draft(read_config(data["target"]), [5, 1, 3], str(tmp_path / "d"), tensor_parallel=4)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [5, 1, 3]  # SGLang adds 1 itself
    assert config["num_attention_heads"] % 4 == 0 and config["intermediate_size"] % 4 == 0  # splits over tp
    assert shapes["fc.weight"] == [64, 192] and shapes["d2t"] == [config["draft_vocab_size"]]
    draft = load_exported_draft(str(tmp_path / "d"), torch.zeros(49152, 64))  # our own loader takes it too
    assert not any(p.abs().sum() for p in draft.parameters())


def test_a_server_that_dies_mid_extraction_is_reported_with_its_last_error_line(data, fake_sglang, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_DIE_AFTER", "3")
    with pytest.raises(ServerFailed) as err:
        _extract(data, tmp_path / "store", "sglang", requests_in_flight=1, precision="float32")
    msg = str(err.value)
    assert "SGLang server exited with code 1 while extracting sample" in msg
    assert "SGLang said: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (fake)" in msg
    (run,) = [json.loads(line) for line in fake_sglang.read_text().splitlines()]
    assert not alive(run["pid"])


def test_a_failed_start_quotes_sglangs_own_error_and_leaves_nothing(data, fake_sglang, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_FAIL", "start")
    with pytest.raises(ServerFailed) as err:
        _extract(data, tmp_path / "store", "sglang", precision="float32")
    msg = str(err.value)
    assert "SGLang server exited with code 1 before becoming healthy" in msg
    assert "SGLang said: RuntimeError: fake sglang: failing at start as asked" in msg
    (run,) = [json.loads(line) for line in fake_sglang.read_text().splitlines()]
    assert not alive(run["pid"]) and not Path(dict(zip(run["argv"], run["argv"][1:]))[
        "--speculative-draft-model-path"]).exists()


def test_sigterm_stops_the_server_and_removes_the_capture_draft(data, fake_sglang, tmp_path):
    """Airflow's on_kill sends the supervised stage SIGTERM; the CLI leaves through close()."""
    env = cli_env(EAGLE3_SGLANG_MODULE="fake_sglang_server", FAKE_SGLANG_STARTUP_S="300",
                  FAKE_SGLANG_ARGV_LOG=str(fake_sglang))
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_DIR), env["PYTHONPATH"]])
    proc = subprocess.Popen([sys.executable, "-m", "eagle3.cli", "extract", "--merged", data["merged"], "--model",
                             data["target"], "--out", str(tmp_path / "s"), "--engine", "sglang",
                             "--storage-option", "fp8-topk", "--device", "cpu"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not fake_sglang.exists() or not fake_sglang.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-2000:]
        time.sleep(0.2)
    run = json.loads(fake_sglang.read_text().splitlines()[0])
    proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, log[-2000:]
    assert not alive(run["pid"]), log[-2000:]
    assert not Path(dict(zip(run["argv"], run["argv"][1:]))["--speculative-draft-model-path"]).exists()
    assert "SGLang server (pid" in log and "stopped" in log


@pytest.mark.parametrize("storage_option", ["bf16", "fp8"])
def test_storage_options_that_need_last_are_refused_with_the_fix(storage_option):
    from eagle3.train.config import TrainConfig
    from eagle3.verify import VerifyConfig

    fix = ("SGLang's /generate returns the aux layers and the target's top-k log-probs, not the final-norm state "
           f"`last` that {storage_option!r} stores; use storage_option 'fp8-topk' (DAG Param storage_option, CLI "
           "--storage-option), or engine 'vllm' (DAG Param target_engine)")
    with pytest.raises(InputError) as err:
        ExtractConfig("m", "x", "o", engine="sglang", storage_option=storage_option)
    assert str(err.value) == (f"ExtractConfig.storage_option={storage_option!r} cannot be filled by "
                              f"ExtractConfig.engine='sglang': {fix}")
    with pytest.raises(InputError) as err:
        TrainConfig(vocab="v", out="o", merged="m", model="x", online=True, target_engine="sglang",
                    storage_option=storage_option)
    assert str(err.value) == (f"TrainConfig.storage_option={storage_option!r} cannot be filled by "
                              f"TrainConfig.target_engine='sglang': {fix}")
    with pytest.raises(InputError,
                       match="VerifyConfig.storage_option=.* cannot be filled by VerifyConfig.target_engine"):
        VerifyConfig("m", target_engine="sglang", storage_option=storage_option)
    ExtractConfig("m", "x", "o", engine="sglang", storage_option="fp8-topk", tensor_parallel_size=8,
                  quantization="fp8")
    with pytest.raises(InputError, match="pipeline_parallel_size=2 with engine='sglang'"):
        ExtractConfig("m", "x", "o", engine="sglang", storage_option="fp8-topk", pipeline_parallel_size=2)


def test_the_cli_takes_engine_sglang_and_exits_2_on_a_storage_it_cannot_fill(data, tmp_path):
    common = ["--merged", data["merged"], "--model", data["target"], "--out", str(tmp_path / "s"), "--engine", "sglang"]
    out = subprocess.run([sys.executable, "-m", "eagle3.cli", "extract", *common, "--storage-option", "bf16"], cwd=REPO,
                         env=cli_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "cannot be filled by ExtractConfig.engine='sglang'" in out.stderr, out.stderr
    env = cli_env(EAGLE3_SGLANG_MODULE="fake_sglang_server", EAGLE3_PRECISION="float32")
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_DIR), env["PYTHONPATH"]])
    out = subprocess.run([sys.executable, "-m", "eagle3.cli", "extract", *common, "--storage-option", "fp8-topk",
                          "--aux-layers", "1,3,5", "--device", "cpu"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["engine"]["name"] == "sglang"
