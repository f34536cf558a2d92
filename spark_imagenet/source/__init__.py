"""Where the images come from: the Kaggle ImageNet download.

* :mod:`.kaggle`: download the archive with the official ``kaggle`` client.
* :mod:`.synset`: WordNet synsets (classes), ``LOC_synset_mapping.txt``, class selection.
* :mod:`.layout`: the Kaggle ILSVRC CLS-LOC folder layout and its CSV files.
* :mod:`.archive`: the downloaded zip (either Kaggle form) read in place, and ``extract``.

Layer: above :mod:`spark_imagenet.storage`, below :mod:`spark_imagenet.dataset`.
"""
