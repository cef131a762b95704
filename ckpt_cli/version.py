"""ckpt's version, in a module of its own so that any stage can read it (the package
root re-exports the API, which imports every stage)."""

__version__ = "0.1.0"
