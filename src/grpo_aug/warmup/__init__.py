"""The supervised warm-up that gives the default tiny model a start GRPO can learn from
(supervised.py), and the starts shipped built (shipped.py, starts/)."""
