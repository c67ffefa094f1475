"""The controller: the job from start to end (`job`), its loops side by side (`loops`),
the rollout bodies (`rollout`, `play`; prompts asked ahead in `prefetch`, requests sent in
claim order by `send_order`), the prompt ledger and the staleness gate (`ledger`,
`staleness`), the weights on their way (`broadcast`), evaluation, checkpoints taken at a
cut (`checkpoints`) and what happens when a process dies (`recovery`).
"""
