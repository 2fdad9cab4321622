"""The policy and the LightningModule that runs a step through its three stages; model loading,
the offline tiny model, the supervised warm-up, LoRA, sharding, held-out evaluation."""
