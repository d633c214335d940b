"""What the lessons train, and the machine they train on: data, models, one loop for every precision.

    from ampteach.training.train import train
    from ampteach.training.config import TrainConfig

data (FashionMNIST, offline), models, text (tiny Shakespeare, offline) and gpt (lesson 9's transformer),
seeding, config (TrainConfig, History), train (the loop),
checkpoint (exact resume), machine (device probing and timing). Imports ampteach.amp and torch.
"""
