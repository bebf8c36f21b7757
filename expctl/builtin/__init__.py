"""The built-in components and their contracts: models, torchvision's models, optimizers and
schedulers, steps, loggers, datasets (the dataset contract and the per-rank data path), and the
catalogue that describes them without importing torch."""
