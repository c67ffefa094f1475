"""grpo"""
