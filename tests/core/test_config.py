"""eagle3.config's renamed keys (RENAMED): an old name still builds the same config, for one release, and says
which name replaces it; both names at once are refused. (store.json: tests/extract/test_store.py; a draft
checkpoint: tests/export/test_export.py; an old run fed back to the paired bench: tests/bench/test_paired_bench.py.)
"""

from __future__ import annotations

import json
import logging

import pytest

from eagle3.cli import build_parser
from eagle3.config import config_from_args, from_dict
from eagle3.draft.config import DraftConfig
from eagle3.errors import InputError
from eagle3.export import ExportConfig
from eagle3.extract.config import ExtractConfig
from eagle3.stats import StatsConfig
from eagle3.train.config import TrainConfig
from eagle3.verify import VerifyConfig

LATER = "the old name is read for one more release"


def _said(caplog, recorded, *messages: str) -> None:
    """Each message went to the log once and was raised once as a DeprecationWarning."""
    logged = [r.getMessage() for r in caplog.records if r.name == "eagle3.config"]
    warned = [str(w.message) for w in recorded if issubclass(w.category, DeprecationWarning)]
    assert logged == warned == list(messages)


def test_old_keyword_arguments_build_the_same_configs(caplog):
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning) as recorded:
        old = ExtractConfig(merged="m", model="x", out="o", storage="fp8", layers=[0, 2, 5])
        train = TrainConfig(vocab="v", out="o", store="s", storage="fp8-topk", layers=(1, 2, 3))
        verify = VerifyConfig("m", storage="bf16")
        stats = StatsConfig("p", storage="fp8")
    assert old == ExtractConfig(merged="m", model="x", out="o", storage_option="fp8", aux_layers=(0, 2, 5))
    assert (train.storage_option, train.aux_layers) == ("fp8-topk", (1, 2, 3))
    assert (verify.storage_option, stats.storage_option) == ("bf16", "fp8")
    _said(caplog, recorded,
          f"ExtractConfig: storage is deprecated, use storage_option; {LATER}",
          f"ExtractConfig: layers is deprecated, use aux_layers; {LATER}",
          f"TrainConfig: storage is deprecated, use storage_option; {LATER}",
          f"TrainConfig: layers is deprecated, use aux_layers; {LATER}",
          f"VerifyConfig: storage is deprecated, use storage_option; {LATER}",
          f"StatsConfig: storage is deprecated, use storage_option; {LATER}")


def test_new_names_say_nothing(recwarn, caplog):
    ExtractConfig(merged="m", model="x", out="o", storage_option="fp8", aux_layers=[0, 2, 5])
    from_dict(TrainConfig, {"vocab": "v", "out": "o", "store": "s", "storage_option": "fp8", "aux_layers": [1, 2, 3]})
    assert [w for w in recwarn if issubclass(w.category, DeprecationWarning)] == []
    assert [r for r in caplog.records if r.name == "eagle3.config"] == []


def test_an_old_config_json_and_old_dag_templates_still_load(tmp_path, caplog):
    """`--config FILE.json` written before the rename (a run's train_config, a hand-written file) and a Config
    dict rendered from an old DAG template (the operators' from_dict)."""
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"vocab": "v", "out": "o", "store": "s", "storage": "fp8", "layers": [1, 2, 3]}))
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning) as recorded:
        cfg = config_from_args(TrainConfig, build_parser().parse_args(["train", "--config", str(path)]))
        dag = from_dict(ExtractConfig, {"merged": "m", "model": "x", "out": "o", "storage": "fp8"}, "extract")
    assert cfg == TrainConfig(vocab="v", out="o", store="s", storage_option="fp8", aux_layers=(1, 2, 3))
    assert dag.storage_option == "fp8"
    _said(caplog, recorded,
          f"--config {path}: storage is deprecated, use storage_option; {LATER}",
          f"--config {path}: layers is deprecated, use aux_layers; {LATER}",
          f"extract: storage is deprecated, use storage_option; {LATER}")


def test_old_flags_on_the_command_line(caplog):
    args = build_parser().parse_args(["extract", "--merged", "m", "--model", "x", "--out", "o",
                                      "--storage", "fp8", "--layers", "0,2,5"])
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning) as recorded:
        cfg = config_from_args(ExtractConfig, args)
    assert cfg == ExtractConfig(merged="m", model="x", out="o", storage_option="fp8", aux_layers=(0, 2, 5))
    _said(caplog, recorded,
          f"command line: --storage is deprecated, use --storage-option; {LATER}",
          f"command line: --layers is deprecated, use --aux-layers; {LATER}")
    # the old flags keep their type and choices, and stay out of --help
    with pytest.raises(SystemExit):
        build_parser().parse_args(["stats", "--prepared", "p", "--storage", "fp4"])
    for command in ("stats", "verify", "extract", "train"):
        sub = build_parser()._subparsers._group_actions[0].choices[command]
        text = sub.format_help()
        assert "--storage-option" in text and "--storage " not in text and "--layers" not in text, command


def test_an_old_and_a_new_name_together_are_refused(tmp_path):
    with pytest.raises(InputError) as err:
        ExtractConfig(merged="m", model="x", out="o", storage="fp8", storage_option="bf16")
    assert str(err.value) == ("ExtractConfig: storage and storage_option name the same setting; "
                              "keep storage_option only")
    args = build_parser().parse_args(["stats", "--prepared", "p", "--storage", "fp8", "--storage-option", "bf16"])
    with pytest.raises(InputError) as err:
        config_from_args(StatsConfig, args)
    assert str(err.value) == ("command line: --storage and --storage-option name the same setting; "
                              "keep --storage-option only")
    with pytest.raises(InputError, match="layers and aux_layers name the same setting"):
        from_dict(TrainConfig, {"vocab": "v", "out": "o", "store": "s", "layers": [1, 2, 3], "aux_layers": [1, 2, 3]})


def test_a_new_name_given_by_flag_overrides_an_old_key_of_the_config_file(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"prepared": "p", "storage": "fp8"}))
    with pytest.warns(DeprecationWarning):
        cfg = config_from_args(StatsConfig, build_parser().parse_args(
            ["stats", "--config", str(path), "--storage-option", "bf16"]))
    assert cfg.storage_option == "bf16"


def test_an_old_name_is_renamed_only_where_its_new_name_is_a_field():
    with pytest.raises(InputError, match=r"unknown key\(s\) export.storage for ExportConfig"):
        from_dict(ExportConfig, {"checkpoint": "c", "out": "o", "storage": "fp8"}, "export")


def test_a_draft_checkpoint_config_with_aux_layer_ids_loads(caplog):
    new = DraftConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=256, vocab_size=50,
                      draft_vocab_size=20, aux_layers=(1, 3, 4))
    saved = new.to_dict()
    assert saved["aux_layers"] == [1, 3, 4] and "aux_layer_ids" not in saved
    old = {("aux_layer_ids" if k == "aux_layers" else k): v for k, v in saved.items()}
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning) as recorded:
        assert DraftConfig.from_dict(old, where="CKPT/step-5/config.json") == new
    _said(caplog, recorded, f"CKPT/step-5/config.json: aux_layer_ids is deprecated, use aux_layers; {LATER}")


@pytest.mark.parametrize("text, message", [
    ("[]", "--config holds a JSON list; it must be one object whose keys are StatsConfig fields"),
    ('{"prepared": "p", ', r"--config: not valid JSON \(Expecting property name"),
])
def test_a_config_file_that_is_not_one_json_object_is_named(tmp_path, text, message):
    from eagle3.errors import InputError

    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"c.json: {message}"):
        config_from_args(StatsConfig, build_parser().parse_args(["stats", "--config", str(path)]))
