"""Every reach into an engine's private internals, each in a module named for
what it fixes, with the Keras versions it applies to and a test that fails
loudly, naming the version, when the internal moves."""
