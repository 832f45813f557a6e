"""The precision policy: decided from the machine (CPU flags + a cached probe, CUDA capability), overridable by
the stage config and by $EAGLE3_PRECISION, one set of choices for every stage."""

from __future__ import annotations

import json

import pytest

from eagle3 import devices
from eagle3.devices import (BF16_CPU_FLAGS, PRECISION_ENV, PRECISIONS, PROBE_ENV, check_precision, cpu_flags,
                            cpu_precision, mm_peak, resolve_precision)
from eagle3.errors import InputError

CPUINFO_AVX2 = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma
"""
CPUINFO_AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
LSCPU_AMX = "Architecture:  x86_64\nFlags:         fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(PRECISION_ENV, raising=False)


def test_cpu_flags_are_read_from_cpuinfo_or_lscpu_text():
    assert {"avx2", "fma"} <= cpu_flags(CPUINFO_AVX2) and not set(BF16_CPU_FLAGS) & cpu_flags(CPUINFO_AVX2)
    assert {"amx_bf16", "avx512_bf16"} <= cpu_flags(CPUINFO_AMX)
    assert {"amx_bf16", "amx_tile"} <= cpu_flags(LSCPU_AMX)
    assert cpu_flags("no flags here") == frozenset()


def test_fp32_without_a_bf16_matrix_engine_bf16_with_one_confirmed_by_the_probe():
    fast = lambda: {"float32": 160.0, "bfloat16": 800.0}  # noqa: E731 - the 2026-12-01 AMX machine's figures
    slow = lambda: {"float32": 120.0, "bfloat16": 0.9}  # noqa: E731 - a build without the bf16 kernels
    never = lambda: pytest.fail("no probe without a bf16 flag")  # noqa: E731
    assert cpu_precision(cpu_flags(CPUINFO_AVX2), never)[0] == "float32"
    name, reason = cpu_precision(cpu_flags(CPUINFO_AMX), fast)
    assert name == "bfloat16" and "amx_bf16" in reason and "800 vs fp32 160" in reason
    assert cpu_precision(cpu_flags(CPUINFO_AMX), slow)[0] == "float32"
    assert cpu_precision(frozenset({"avx512_bf16"}), None) == ("bfloat16", "CPU flags avx512_bf16")


def test_decoding_is_probed_at_its_own_shape():
    """A bf16 engine that wins the big torch.mm but loses 1- and 4-row linears (the 2026-12-02 AMX machine):
    batched stages get bf16, the project decoder fp32, each with the figures that decided it."""
    flags = cpu_flags(CPUINFO_AMX)
    mm = lambda: {"float32": 45.0, "bfloat16": 334.0}  # noqa: E731
    decode = lambda: {"float32": 12.1, "bfloat16": 5.1}  # noqa: E731
    assert cpu_precision(flags, mm, "matmul")[0] == "bfloat16"
    name, reason = cpu_precision(flags, decode, "decode")
    assert name == "float32" and "decode-shaped linear (1/4 rows) bf16 5 vs fp32 12" in reason
    with pytest.raises(ValueError, match="workload 'gemv'"):
        resolve_precision("auto", "cpu", workload="gemv")


def test_the_decode_probe_is_cached_apart_from_the_matmul_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path))
    monkeypatch.setattr(devices, "mm_peak", lambda d, **_: devices.MatmulPeak(d, "cpu", 512, 1.0, 100.0))
    monkeypatch.setattr(devices, "decode_rate", lambda d, **_: {"float32": 12.0, "bfloat16": 5.0}[d])
    assert devices._cached_cpu_probe("decode") == {"float32": 12.0, "bfloat16": 5.0}
    assert devices._cached_cpu_probe() == {"float32": 100.0, "bfloat16": 100.0}
    keys = sorted(json.loads((tmp_path / "precision-probe.json").read_text()))
    assert len(keys) == 2 and keys[1].endswith("|decode")


def test_decode_rate_measures_both_dtypes():
    assert devices.decode_rate("float32", rows=(1,), width=128, min_s=0.01) > 0
    assert devices.decode_rate("bfloat16", rows=(1, 4), width=128, min_s=0.01) > 0


def test_this_machine_gets_what_its_flags_say(monkeypatch):
    """Done-when for an AVX2-only machine: auto picks fp32 (and runs no probe)."""
    got = resolve_precision("auto", "cpu")
    if not set(BF16_CPU_FLAGS) & cpu_flags():
        assert got.name == "float32" and "no bf16 matrix engine" in got.reason
    else:  # a machine with AMX/AVX512-BF16: the flags decide, confirmed by the probe
        monkeypatch.setenv(PROBE_ENV, "0")
        assert resolve_precision("auto", "cpu").name == "bfloat16"
    assert got.requested == "auto" and got.to_dict() == {"name": got.name, "requested": "auto", "reason": got.reason}


def test_the_config_wins_then_the_env_var_then_the_machine(monkeypatch):
    assert resolve_precision("bfloat16", "cpu").name == "bfloat16"
    monkeypatch.setenv(PRECISION_ENV, "bfloat16")
    forced = resolve_precision("auto", "cpu")
    assert forced.name == "bfloat16" and forced.bf16 and forced.reason == f"${PRECISION_ENV}=bfloat16"
    assert resolve_precision("float32", "cpu").name == "float32"  # an explicit value beats the env var
    monkeypatch.setenv(PRECISION_ENV, "fp16")
    with pytest.raises(InputError, match=r"\$EAGLE3_PRECISION='fp16': use auto, float32, bfloat16"):
        resolve_precision("auto", "cpu")


def test_bad_values_are_refused_by_every_stage_config():
    from eagle3.evaluate.config import EvaluateConfig
    from eagle3.extract.config import ExtractConfig
    from eagle3.regenerate.config import RegenerateConfig
    from eagle3.train.config import TrainConfig

    assert PRECISIONS == ("auto", "float32", "bfloat16") and check_precision("auto") == "auto"
    cases = [(ExtractConfig, dict(merged="m", model="t", out="o"), "ExtractConfig.precision"),
             (TrainConfig, dict(store="s", vocab="v", out="o"), "TrainConfig.precision"),
             (EvaluateConfig, dict(model="t", draft="d", out="o"), "EvaluateConfig.precision"),
             (RegenerateConfig, dict(manifest="m", out="o"), "regenerate: precision")]
    for cls, required, where in cases:
        assert cls(**required).precision == "auto"
        assert cls(**required, precision="bfloat16").precision == "bfloat16"
        with pytest.raises(InputError, match=f"{where}='half': use auto, float32, bfloat16"):
            cls(**required, precision="half")


def test_the_cli_offers_the_shared_choices():
    from eagle3.cli import build_parser

    p = build_parser()
    args = ["extract", "--merged", "m", "--model", "t", "--out", "o"]
    assert p.parse_args([*args, "--precision", "bfloat16"]).precision == "bfloat16"
    with pytest.raises(SystemExit):
        p.parse_args([*args, "--precision", "half"])


def test_mm_peak_keeps_the_slow_path_short():
    """n grows only while a product is quick: bf16 on an AVX2-only CPU stops near 512, not at 2048."""
    peak = mm_peak("bfloat16", max_n=256, repeats=1)
    assert peak.dtype == "bfloat16" and 128 <= peak.n <= 256 and peak.gflops > 0 and peak.gflops_cpu > 0
    assert set(peak.to_dict()) == {"dtype", "device", "n", "gflops", "gflops_cpu"}


def test_a_windowed_peak_runs_products_for_the_window():
    """One ~1-ms product misses the worker threads' CPU time (Linux accounts it late): the probe's per-CPU-second
    rate read the wall rate, 2x, by chance. Each of its windows runs products for window_s."""
    import inspect
    import time

    t0 = time.perf_counter()
    peak = mm_peak("float32", max_n=128, repeats=3, window_s=0.05)
    assert time.perf_counter() - t0 >= 3 * 0.05 and peak.n == 128 and peak.gflops > 0 and peak.gflops_cpu > 0
    # the default, which the probe and the benches' peaks (mm_peaks) use
    assert inspect.signature(mm_peak).parameters["window_s"].default == 0.05


def test_the_probe_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path))
    calls = []

    def fake(dtype, device="cpu", max_n=2048, **kw):
        calls.append((dtype, max_n, kw.get("repeats"), kw.get("window_s")))
        return devices.MatmulPeak(dtype, device, max_n, 100.0, 90.0 if dtype == "float32" else 450.0)

    monkeypatch.setattr(devices, "mm_peak", fake)
    assert devices._cached_cpu_probe() == {"float32": 90.0, "bfloat16": 450.0}
    assert devices._cached_cpu_probe() == {"float32": 90.0, "bfloat16": 450.0}
    assert calls == [("float32", 512, 5, None), ("bfloat16", 512, 5, None)]  # mm_peak's windows (50 ms)
    (key, value), = json.loads((tmp_path / "precision-probe.json").read_text()).items()
    assert "threads" in key and value == {"float32": 90.0, "bfloat16": 450.0}
