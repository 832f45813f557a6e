"""The fake SGLang server's model (fake_sglang_server.py with --enable-return-hidden-states): real numbers from a
transformers causal LM, shaped the way SGLang returns them. Written from SGLang's source, not from eagle3's
engine:

- llama.py ``set_eagle3_layers_to_capture(ids)``: ``layers_to_capture = [i + 1 for i in ids]``, and the
  layer loop appends ``hidden_states + residual`` BEFORE layer k for each k in it (so in layer order);
  LogitsProcessor (capture FULL, as the EAGLE worker sets for the target's prefill) stores them concatenated,
  or, with no aux capture, the final-norm state.
- scheduler ``process_batch_result_prefill``: the prefill's entry is the prompt's rows; logits processor
  ``_get_logits``: logits in the model's dtype, then ``.float()`` (with --enable-fp32-lm-head: the
  final-norm state and lm_head cast to fp32 first); input top-logprobs are
  ``log_softmax`` of those over the full vocab; ``add_input_logprob_return_values``: ``[None]`` first and
  the last position's popped (it is the sampled one, whose top-k is ``output_top_logprobs[0]``);
  tokenizer_manager: each entry is ``(logprob, token_id, text)``, text None without return_text_in_logprobs.
- the EAGLE-3 draft is read as SGLang's loader would: config.json's eagle_config ids, and the weights it
  needs under their export names (an unknown name is skipped by SGLang, a missing one fails the load).
"""

from __future__ import annotations

import json
import os
import threading

import torch

DTYPES = {"auto": None, "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float": torch.float32, "float32": torch.float32}


class Target:
    def __init__(self, args):
        from transformers import AutoModelForCausalLM

        dtype = DTYPES[args.dtype] or torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).eval()
        self.layers_to_capture = None
        if args.speculative_algorithm == "EAGLE3":
            self.layers_to_capture = [i + 1 for i in self._draft_layer_ids(args.speculative_draft_model_path)]
        self.radix = not args.disable_radix_cache
        self.fp32_head = args.enable_fp32_lm_head
        self.seen: list[list[int]] = []  # prompts a radix cache would hold
        self.lock = threading.Lock()  # one forward at a time: the capture hooks are the model's, not a request's

    def _draft_layer_ids(self, draft: str) -> list[int]:
        from safetensors import safe_open

        config = json.load(open(os.path.join(draft, "config.json")))
        assert config["architectures"] == ["LlamaForCausalLMEagle3"], config["architectures"]
        h = self.model.config.hidden_size
        with safe_open(os.path.join(draft, "model.safetensors"), "pt") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        assert config["hidden_size"] == h and shapes["fc.weight"] == [h, 3 * h], (config["hidden_size"], shapes)
        assert shapes["lm_head.weight"] == [config["draft_vocab_size"], h], shapes["lm_head.weight"]
        assert shapes.get("d2t", [config["draft_vocab_size"]]) == [config["draft_vocab_size"]]
        q = config["num_attention_heads"] * config["head_dim"]
        assert shapes["midlayer.self_attn.q_proj.weight"] == [q, 2 * h], shapes
        return list(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])

    def generate(self, req: dict) -> dict:
        with self.lock:
            return self._generate(req)

    @torch.inference_mode()
    def _generate(self, req: dict) -> dict:
        ids = [int(t) for t in req["input_ids"]]
        k = int(req.get("top_logprobs_num") or 0)
        cached = 0
        if self.radix:  # the longest prefix of an earlier prompt: its rows are not recomputed
            cached = max((_common(ids, p) for p in self.seen), default=0)
            cached = min(cached, len(ids) - 1)
            self.seen.append(ids)
        captured, normed = [], []
        layers = self.model.model.layers
        hooks = [layers[j].register_forward_pre_hook(
            lambda _m, a, kw: captured.append(kw["hidden_states"] if "hidden_states" in kw else a[0]),
            with_kwargs=True) for j in sorted(set(self.layers_to_capture or ()))]
        hooks.append(self.model.model.norm.register_forward_hook(lambda _m, _a, o: normed.append(o)))
        try:
            self.model.model(input_ids=torch.tensor([ids]), use_cache=False)  # the hooks keep what SGLang returns
        finally:
            for h in hooks:
                h.remove()
        # the layers' inputs in layer order, as SGLang's loop appends them; else the final-norm state
        states = torch.cat([c[0] for c in captured], dim=-1) if self.layers_to_capture else normed[0][0]
        head = self.model.lm_head.weight
        logits = (normed[0][0].float() @ head.float().T) if self.fp32_head else (normed[0][0] @ head.T).float()
        logprobs = torch.log_softmax(logits, dim=-1)
        top = logprobs.topk(k, dim=-1) if k else None

        def entry(t: int):
            return [[float(v), int(i), None] for v, i in zip(top.values[t].tolist(), top.indices[t].tolist())]

        meta = {"id": "x", "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": cached,
                "finish_reason": {"type": "length", "length": 1}, "e2e_latency": 0.01}
        if req.get("return_hidden_states"):
            meta["hidden_states"] = [states[cached:].float().tolist()]
        if req.get("return_logprob") and k:
            start = int(req.get("logprob_start_len", -1))
            meta["input_top_logprobs"] = ([None] + [entry(t) for t in range(len(ids) - 1)]) if start == 0 else []
            meta["output_top_logprobs"] = [entry(len(ids) - 1)]
        nxt = int(logits[-1].argmax())
        return {"text": f"tok{nxt}", "output_ids": [nxt], "meta_info": meta}


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
