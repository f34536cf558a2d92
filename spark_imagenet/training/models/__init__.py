"""The models, and what the driver may know of them without TensorFlow.

* :mod:`.specs`: the known model names and their smallest input size (no
  TensorFlow; the driver checks ``--model`` and ``--image-size`` with it).
* :mod:`.alexnet_layers`: AlexNet's layer table and size arithmetic (no TensorFlow).
* :mod:`.registry`: build and compile a model by name (imports ``tf_keras``;
  only the TensorFlow worker process imports it).
* :mod:`.alexnet`: the AlexNet ``tf_keras`` model.

Importing this package imports no TensorFlow.
"""
