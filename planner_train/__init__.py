"""Planner GRPO training (``python -m planner_train``): plan -> execute via serve -> reflect -> replan. Filled by the trainers issue."""
