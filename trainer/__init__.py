"""The trainer: one stage of GRPO (TRL `GRPOTrainer`) with its SFT warm start, run in a child process."""
