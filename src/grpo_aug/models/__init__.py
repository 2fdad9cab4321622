"""Model loading, the offline tiny model, the supervised warm-up and the GRPO LightningModule."""
