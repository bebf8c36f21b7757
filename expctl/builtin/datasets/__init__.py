"""Built-in datasets, each registered by name (``data=NAME``):

- `tensors`: helpers of the in-memory sets (splits, normalisation, the missing-files error);
- `idx`: Fashion-MNIST (embedded default, Debian's files), MNIST, KMNIST, EMNIST, QMNIST;
- `vision`: torchvision's other offline datasets (CIFAR, SVHN, STL10, USPS in memory; Flowers102,
  Food101, DTD, ... streamed from their files);
- `images`: ``image_folder`` (class-per-subfolder JPEG/PNG trees) and ``imagenet``, streamed;
  `imagefiles`: how their files become samples, with CPU or GPU decoding;
- `arrays`: features and targets from .npy / .npz / CSV files;
- `synthetic`: random tensors for shape-only benchmarks;
- `tokens`: token ids in flat binary files (nanoGPT's train.bin / val.bin), for language models.
"""
