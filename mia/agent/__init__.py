"""The Executor agent: tool-call protocol, tools and registry, the multi-turn loop, prompts shared by train and serve."""
