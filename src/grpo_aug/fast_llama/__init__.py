"""Lean paths for Llama-family models (Llama, Mistral, Qwen2): the HF math, run on the model's own
weights without the HF forward's per-call bookkeeping. `decode`: one token per row against
preallocated KV buffers (sampling); `forward`: packed real tokens only (prefill and scoring);
`logprobs`: token log-probs of completions at each row's temperature, through `forward` where it
applies, else the model's own forward. Checked against the HF forward in the tests; they step aside
where they cannot apply."""
