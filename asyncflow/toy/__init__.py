"""The toy world the examples and tests run in, with nothing downloaded: ``tiny`` (a
tiny Qwen2/Llama with a character tokenizer, its supervised warm start, the tiny reward
model) and ``tasks`` (the arithmetic tasks it learns, their rewards and data, and
``add2``, two-digit addition in words, for a real model). Above the engines and the
algorithms, which never import it."""
