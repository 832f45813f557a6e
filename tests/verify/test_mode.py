"""Training mode (eagle3.verify.mode): the cost of both modes, hand-computed, and the gate's choice."""

from __future__ import annotations

import logging

import pytest

from eagle3 import storage
from eagle3.errors import InputError
from eagle3.verify import VerifyConfig, verify
from eagle3.verify.mode import choose, costs
from tests.verify.test_verify import failed_checks, merged  # noqa: F401 - the fixture


def test_costs_by_hand():
    # 1000 tokens in 10 samples, H=4, bf16: 8H+5 = 37 B/token, + 8 x (10 + 1) offset bytes
    c = costs("bf16", 4, 1000, 10, epochs=3, extract_tokens_per_s=10.0, train_tokens_per_s=100.0)
    assert c["offline"]["bytes"] == 1000 * 37 + 88
    assert c["offline"]["extract_hours"] == pytest.approx(1000 / 10 / 3600)
    assert c["offline"]["train_hours"] == c["online"]["train_hours"] == pytest.approx(3000 / 100 / 3600)
    assert c["online"]["target_hours"] == pytest.approx(3000 / 10 / 3600)  # the forward, every epoch
    assert c["online"]["bytes"] == 0
    assert c["online"]["hours"] - c["offline"]["hours"] == pytest.approx(2000 / 10 / 3600)


def test_costs_price_only_what_the_store_lacks():
    # 600 of the 1000 tokens (6 of 10 samples) stored: extract skips them, online reads them from the store
    c = costs("bf16", 4, 1000, 10, epochs=3, extract_tokens_per_s=10.0, train_tokens_per_s=100.0,
              stored_tokens=600, stored_samples=6)
    assert c["offline"]["bytes"] == 400 * 37 + 8 * (4 + 1)
    assert c["offline"]["extract_hours"] == pytest.approx(400 / 10 / 3600)
    assert c["online"]["target_hours"] == pytest.approx(3 * 400 / 10 / 3600)
    assert c["offline"]["train_hours"] == pytest.approx(3000 / 100 / 3600)  # training reads every sample
    assert "6 of 10 samples already stored" in choose("auto", c, 10**9, 1.1, "/s")["reason"]


def test_auto_takes_offline_when_the_store_fits_with_headroom_else_online():
    c = costs("bf16", 4, 1000, 10, 1, 10.0, 100.0)
    need = c["offline"]["bytes"]
    assert choose("auto", c, int(need * 1.1) + 1, 1.1, "/s")["mode"] == "offline"
    short = choose("auto", c, int(need * 1.05), 1.1, "/s")
    assert short["mode"] == "online" and "does not fit" in short["reason"] and short["fits"] is False
    assert choose("auto", c, None, 1.1, "s3://b/p")["mode"] == "offline"  # unknown free space: object store
    forced = choose("online", c, 10**15, 1.1, "/s")
    assert forced["mode"] == "online" and forced["reason"].startswith("requested")
    with pytest.raises(InputError, match="training_mode"):
        VerifyConfig("m", training_mode="sideways")


def test_gate_records_the_mode_and_online_lifts_the_space_check(merged, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)
    result = verify(VerifyConfig(merged, training_mode="auto", epochs=2))
    assert result["training_mode"]["mode"] == "offline" and result["training_mode"]["requested"] == "auto"
    assert result["training_mode"]["costs"]["epochs"] == 2
    assert "offline: extract" in caplog.text and "online:  no store" in caplog.text
    # a store far too big for the disk: offline fails the gate, auto goes online and passes
    failed, _, _ = failed_checks(merged, hidden_size=10**12)
    assert failed == {"extraction_space"}
    result = verify(VerifyConfig(merged, hidden_size=10**12, training_mode="auto"))
    assert result["passed"] and result["training_mode"]["mode"] == "online"
    assert "does not fit" in result["training_mode"]["reason"]
    space = {c["name"]: c for c in result["checks"]}["extraction_space"]
    assert space["passed"] and space["detail"].startswith("not needed, training online")
    assert storage.read_json(f"{merged}/verify.json")["training_mode"]["mode"] == "online"


def test_online_waives_the_store_space_but_not_max_hours(merged, capsys):  # noqa: F811
    """Online training still runs the target over every new token (each epoch): it waives the space, not max_hours."""
    from eagle3.cli import main as cli_main

    slow = ["verify", "--merged", merged, "--hidden-size", str(10**12), "--tokens-per-s", "1", "--training-mode",
            "online"]
    assert cli_main(slow) == 0  # the store would not fit: online needs none
    assert cli_main([*slow, "--max-hours", "0.001"]) != 0
    err = capsys.readouterr().err
    assert "verify gate failed: extraction_space: training online (no store), so only max_hours applies" in err
    assert "over the max_hours limit of 0.001 h by" in err
    result = storage.read_json(f"{merged}/verify.json")
    assert result["failed"] == ["extraction_space"] and result["training_mode"]["mode"] == "online"
