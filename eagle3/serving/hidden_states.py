"""vLLM's hidden-state extraction mode: the server flags and the files, the one owner of both (torch-free).

A vLLM (>= 0.18) server started with :func:`speculative_config` and :func:`kv_transfer_config` runs the
target's forward on each request's prompt and, when the request finishes, writes the states of the chosen
layers to one file per request (``eagle3.serving.hidden_states_connector``, loaded by the server from this
package). The completion names the file in ``kv_transfer_params.hidden_states_path``.

Layer ids are vLLM's (``model_executor/models/llama.py`` records ``hidden_states + residual`` before layer k,
and after the last layer as id L): id k is the INPUT of layer k, i.e. the output of layer k-1, and id L
(the layer count) is the last layer's output before the final norm. The project's aux layer i is the output
of layer i (SGLang's convention, what the store holds), hence :func:`vllm_layer_ids`.

A file (safetensors, no pickle): ``hidden_states`` [tokens, len(ids), H] in the server's dtype, the ids in
ascending order (vLLM appends them in layer order whatever order the config lists), ``token_ids`` [tokens]
int64 (the prompt), and metadata ``format`` = FORMAT and ``layer_ids`` (JSON list, ascending).
"""

from __future__ import annotations

FORMAT = "eagle3-vllm-hidden-states/1"
CONNECTOR = "HiddenStatesConnector"
CONNECTOR_MODULE = "eagle3.serving.hidden_states_connector"
STATES, TOKENS = "hidden_states", "token_ids"
"""The tensors of a file."""


def vllm_layer_ids(aux_layers: list[int], num_layers: int) -> list[int]:
    """vLLM's ids (ascending, no repeats) that give the outputs of ``aux_layers`` and the pre-norm output of
    the last layer: output of layer i = vLLM id i + 1; the last layer's output = id ``num_layers``."""
    return sorted({int(i) + 1 for i in aux_layers} | {int(num_layers)})


def speculative_config(layer_ids: list[int]) -> dict:
    """vLLM's --speculative-config for extraction mode (one "speculative" token: the proposer only caches)."""
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}


def kv_transfer_config(folder: str) -> dict:
    """vLLM's --kv-transfer-config: this package's connector, writing one file per request into ``folder``."""
    return {"kv_connector": CONNECTOR, "kv_role": "kv_producer", "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_connector_extra_config": {"shared_storage_path": str(folder)}}
