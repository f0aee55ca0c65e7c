"""The Executor service (``python -m serve``): runs the Executor loop on a plan (/execute, /continue). Filled by the agent-loop issue."""
