"""The models, and what the driver may know of them without TensorFlow.

* :mod:`spark_imagenet.training.job.model_specs`: one row per registered model, its smallest input size, fixed
  width, training recipe and builder ``package.module:function`` (no TensorFlow; the driver checks ``--model``,
  ``--image-size`` and ``--width`` with it, and finds a user's builder ``package.module:function`` by reading its
  source without running it).
* :mod:`spark_imagenet.training.job.alexnet_layers`: AlexNet's layer table and size arithmetic (no TensorFlow).
* :mod:`.registry`: build and compile a model by name (importing the builder its row names), or import and
  check a user's builder the same way (imports ``tf_keras``; only the TensorFlow worker process imports it).
* :mod:`.alexnet`: the AlexNet ``tf_keras`` model.
* :mod:`.resnet`: ResNet-50 (``tf_keras.applications.ResNet50``, random weights; imports ``tf_keras`` only
  when it builds the model).

Importing this package imports no TensorFlow.
"""
