"""What the lessons train, and the machine they train on: data, models, one loop for every precision.

    from ampteach.training.train import train
    from ampteach.training.config import TrainConfig

data (FashionMNIST, offline), models, seeding, config (TrainConfig, History), train (the loop),
checkpoint (exact resume), machine (device probing and timing). Imports ampteach.amp and torch.
"""
