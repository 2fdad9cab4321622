"""Tools and multi-turn rollouts: what the policy may call mid-completion (rollout/tools=...)."""
