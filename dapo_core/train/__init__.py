"""The trainer and what it needs: rollout, batching, the update, checkpoints, sinks."""
