"""Executor GRPO training (``python -m executor_train``): dataset, reward, tool config. Filled by the trainers issue."""
