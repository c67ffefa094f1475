"""Weight versions from the trainer to the generators: staged by the trainer
(`TrainerPublisher`), pulled by each generator (`pull`).
"""
