"""GRPO's math and the train step, with no processes or Monarch: advantages, the loss, the
sampling distribution's log-probs, batching and the trainer's step (`step.TrainerCore`).
"""
