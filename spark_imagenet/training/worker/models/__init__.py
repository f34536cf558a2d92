"""The models, and what the driver may know of them without TensorFlow.

* :mod:`.specs`: the known model names, their smallest input size and training recipes (no
  TensorFlow; the driver checks ``--model``, ``--image-size`` and ``--width`` with it, and finds a user's
  builder ``package.module:function`` by reading its source without running it).
* :mod:`.alexnet_layers`: AlexNet's layer table and size arithmetic (no TensorFlow).
* :mod:`.registry`: build and compile a model by name, or import and check a user's builder (imports
  ``tf_keras``; only the TensorFlow worker process imports it).
* :mod:`.alexnet`: the AlexNet ``tf_keras`` model.
* :mod:`.resnet`: ResNet-50 (``tf_keras.applications.ResNet50``, random weights; imports ``tf_keras`` only
  when it builds the model).

Importing this package imports no TensorFlow.
"""
