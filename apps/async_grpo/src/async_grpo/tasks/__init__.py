"""What the policy is trained on: prompts with targets (`prompts`: generated tasks and
files), the reward functions (`rewards`) and the multi-turn environments of `rl_envs`
(`environments`).
"""
