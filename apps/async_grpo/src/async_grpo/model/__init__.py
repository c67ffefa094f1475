"""The policy: Qwen2-architecture checkpoints built or loaded (`policy`), the word-level
tokenizer, finding a model directory (`locate`), FSDP sharding.
"""
