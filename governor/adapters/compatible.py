"""The endpoint families of servers that speak OpenAI's API (Azure OpenAI, vLLM, TGI's
Messages API), which the openai adapter governs (it matches on the path, whoever serves
it), and those of vLLM and TGI that no adapter governs, refused by default deny.

No adapter of its own (`ADAPTERS` is empty): this module only declares rows of the
endpoint table (governor.adapters.endpoints). What is specific to each server:

- Azure OpenAI: the deployment in the path (`/openai/deployments/{deployment}/...`, the
  `api-version` query) names the model when the body names none, and in the v1 API
  (`/openai/v1/...`) the body's `model` is a deployment name. A deployment is priced as the
  model the config file's `deployments` maps it to, else as its own name (a deployment named
  after its model, `gpt-4o-mini-prod`, is priced as `gpt-4o-mini`); under a cost cap an
  unpriced one is refused with a message saying both ways. The answers' `model` is the
  real model, and their usage is charged at its price.
- vLLM: `max_tokens` and `max_completion_tokens` are both read (the larger reserved, both
  fitted); `stream_options` (`include_usage`, `continuous_usage_stats`) as OpenAI's; a
  `stream` that is not a boolean (vLLM's pydantic reads "true" as true) is refused. Its
  pooling endpoints run the model on the agent's input (`/pooling`, `/classify`,
  `/score`, `/rerank`, their `/v1`, `/v2` forms): no adapter counts them, so default deny
  refuses them; `/tokenize` and `/detokenize` spend nothing and may be allowed.
- TGI: `/v1/chat/completions` and `/v1/completions` here; `/generate` and
  `/generate_stream` are the tgi adapter's; `POST /` and `/invocations` (the /generate body
  on paths the governor cannot claim for every host) are refused by default deny.
"""

from __future__ import annotations

from governor.adapters.endpoints import GOVERNED, REFUSED, Endpoint, Probe

ADAPTERS: tuple = ()  # the openai adapter governs these families

_CHAT = b'"messages":[{"role":"user","content":"hi"}]'
_AZURE = "/openai/deployments/{deployment}"
_VERSION = "?api-version=2024-10-21"
_DENY = "no adapter counts it: refused by default deny"

ENDPOINTS = (
    Endpoint("Azure OpenAI", "chat completions", "POST", _AZURE + "/chat/completions", GOVERNED, "openai",
             Probe("POST", "/openai/deployments/gpt-4o-mini-prod/chat/completions" + _VERSION, b"{" + _CHAT + b"}",
                   headers=(("api-key", "azure-key"),)),
             "the deployment is the model (config `deployments` maps it to the model it is priced as)"),
    Endpoint("Azure OpenAI", "chat completions", "POST", _AZURE + "/chat/completions", GOVERNED, "openai",
             Probe("POST", "/openai/deployments/gpt-4o-mini-prod/chat/completions" + _VERSION,
                   b'{"stream":true,' + _CHAT + b"}", headers=(("api-key", "azure-key"),)),
             "SSE (the first chunk's empty choices carry prompt_filter_results); usage chunk asked for",
             stream=True),
    Endpoint("Azure OpenAI", "legacy completions", "POST", _AZURE + "/completions", GOVERNED, "openai",
             Probe("POST", "/openai/deployments/gpt-35-turbo-instruct/completions" + _VERSION, b'{"prompt":"hi"}',
                   headers=(("api-key", "azure-key"),)),
             "as OpenAI's"),
    Endpoint("Azure OpenAI", "embeddings", "POST", _AZURE + "/embeddings", GOVERNED, "openai",
             Probe("POST", "/openai/deployments/text-embedding-3-small/embeddings" + _VERSION, b'{"input":"hi"}',
                   headers=(("api-key", "azure-key"),)),
             "input tokens only"),
    Endpoint("Azure OpenAI", "chat completions (v1 API)", "POST", "/openai/v1/chat/completions", GOVERNED, "openai",
             Probe("POST", "/openai/v1/chat/completions", b'{"model":"gpt-4o-mini-prod",' + _CHAT + b"}",
                   headers=(("api-key", "azure-key"),)),
             "the body's model is the deployment"),
    Endpoint("Azure OpenAI", "responses (v1 API)", "POST", "/openai/v1/responses", GOVERNED, "openai",
             Probe("POST", "/openai/v1/responses", b'{"model":"gpt-4o-mini-prod","input":"hi"}',
                   headers=(("api-key", "azure-key"),)),
             "the body's model is the deployment"),
    Endpoint("vLLM", "chat completions", "POST", "/v1/chat/completions", GOVERNED, "openai",
             Probe("POST", "/v1/chat/completions",
                   b'{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":'
                   b'{"include_usage":true,"continuous_usage_stats":true},' + _CHAT + b"}"),
             "as OpenAI's; max_tokens and max_completion_tokens both fitted; a non-boolean stream refused",
             stream=True),
    Endpoint("vLLM", "legacy completions", "POST", "/v1/completions", GOVERNED, "openai",
             Probe("POST", "/v1/completions", b'{"model":"meta-llama/Llama-3.1-8B","prompt":"hi","max_tokens":16}'),
             "as OpenAI's"),
    Endpoint("vLLM", "pooling", "POST", "/pooling", REFUSED, None,
             Probe("POST", "/pooling", b'{"model":"intfloat/e5-small","input":"hi"}'), _DENY),
    Endpoint("vLLM", "classify", "POST", "/classify", REFUSED, None,
             Probe("POST", "/classify", b'{"model":"jason9693/Qwen2.5-1.5B-apeach","input":"hi"}'), _DENY),
    Endpoint("vLLM", "score", "POST", "/score", REFUSED, None,
             Probe("POST", "/score", b'{"model":"BAAI/bge-reranker-v2-m3","text_1":"a","text_2":"b"}'), _DENY),
    Endpoint("vLLM", "score", "POST", "/v1/score", REFUSED, None,
             Probe("POST", "/v1/score", b'{"model":"BAAI/bge-reranker-v2-m3","text_1":"a","text_2":"b"}'), _DENY),
    Endpoint("vLLM", "rerank", "POST", "/rerank", REFUSED, None,
             Probe("POST", "/rerank", b'{"model":"BAAI/bge-reranker-v2-m3","query":"a","documents":["b"]}'), _DENY),
    Endpoint("vLLM", "rerank", "POST", "/v1/rerank", REFUSED, None,
             Probe("POST", "/v1/rerank", b'{"model":"BAAI/bge-reranker-v2-m3","query":"a","documents":["b"]}'),
             _DENY),
    Endpoint("vLLM", "rerank", "POST", "/v2/rerank", REFUSED, None,
             Probe("POST", "/v2/rerank", b'{"model":"BAAI/bge-reranker-v2-m3","query":"a","documents":["b"]}'),
             _DENY),
    Endpoint("vLLM", "tokenize", "POST", "/tokenize", REFUSED, None,
             Probe("POST", "/tokenize", b'{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hi"}'),
             "spends nothing: refused by default deny unless the operator's allow-list names it"),
    Endpoint("TGI", "chat completions (Messages API)", "POST", "/v1/chat/completions", GOVERNED, "openai",
             Probe("POST", "/v1/chat/completions", b'{"model":"tgi","max_tokens":20,' + _CHAT + b"}"),
             "as OpenAI's; the model `tgi` is priced as the family `tgi`"),
    Endpoint("TGI", "generate (compat route)", "POST", "/", REFUSED, None,
             Probe("POST", "/", b'{"inputs":"hi","parameters":{"max_new_tokens":20}}'),
             "the /generate body on the root path: " + _DENY),
)

__all__ = ["ADAPTERS", "ENDPOINTS"]
