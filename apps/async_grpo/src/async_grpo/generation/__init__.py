"""Sampling: the engines a generator replica samples with (`engines`: transformers or
vLLM), the sampling loop (`decoding`), multi-turn play against environments (`multiturn`),
and what was generated turned into the buffer's episodes (`episodes`).
"""
