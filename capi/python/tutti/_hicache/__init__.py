"""The parts of :mod:`tutti.sglang` that do not need SGLang: keys, pool layouts, config, pins."""
