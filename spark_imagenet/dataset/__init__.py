"""The sharded dataset: TFRecord shards and the manifest that commits them.

* :mod:`.manifest`: ``manifest.json``, the versioned record of classes, splits and shards.
* :mod:`.tfrecord`: TFRecord framing and ``tf.train.Example`` encoding, without TensorFlow.
* :mod:`.quality`: what each image file really is, and the repair of those TensorFlow cannot use.
* :mod:`.sharding`: build the shards and the manifest from a Kaggle source (``shard``).
* :mod:`.transfer`: publish shards to a bucket, verified and resumable (``upload``).
* :mod:`.cache`: the per-host verified cache of shards that barrier tasks read.
* :mod:`.images`: image files a user names (``predict``), checked from their headers.

Layer: above :mod:`spark_imagenet.source`, below :mod:`spark_imagenet.training`.
"""
