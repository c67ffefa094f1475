"""The app's Monarch actors: thin wrappers that run the pure code in their own processes.

Import each from its module (`async_grpo.actors.generator`, ...): this package imports
nothing itself, so a process that hosts only the dataset or the reward function never pays
for importing `transformers`.
"""
