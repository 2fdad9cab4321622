"""Lean paths for Llama-family models (Llama, Mistral, Qwen2): the HF math, run on the model's own
weights without the HF forward's per-call bookkeeping. `decode`: one token per row against
preallocated KV buffers (sampling); `forward`: packed real tokens only (prefill and scoring).
Both are checked against the HF forward in the tests and step aside where they cannot apply."""
