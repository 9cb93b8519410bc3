"""keras-mxnet 2.2: a context list of devices."""
