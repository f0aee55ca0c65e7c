"""The RL engine: GRPO math, trainer, Ray workers (FSDP2), generators (transformers, vLLM), checkpoints, model merger."""
