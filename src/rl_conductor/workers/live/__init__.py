"""Live workers: clients of real model servers behind the :class:`~rl_conductor.workers.base.Worker`
protocol, one module per wire API.

* :mod:`.openai_chat` — OpenAI-compatible chat completions (``kind: openai``): KServe / vLLM
  InferenceServices under ``/openai/v1``, llama.cpp, ``conductor worker serve``, OpenAI;
* :mod:`.anthropic_messages` — Anthropic Messages (``kind: anthropic``);
* :mod:`.gemini` — Google Gemini (``kind: gemini``);
* :mod:`.base` — what they share: per-attempt timeout, retries with backoff and ``Retry-After``
  (:mod:`.resilience`), a circuit breaker, the run-wide spend guard (:mod:`.spend`), usage and
  cost accounting; :mod:`.secrets` keeps API keys out of logs and messages;
* :mod:`.server` — ``conductor worker serve``: a local model served as an OpenAI-compatible
  endpoint on a KServe ModelServer; :mod:`.testing` — scripted HTTP servers speaking each
  vendor's wire format, for tests and demos.

Importing a wire module registers its ``kind`` with the pool loader; the loader imports them
lazily, so pools without live workers never import the SDKs.
"""
