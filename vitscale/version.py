"""vitscale's version (``vitscale.__version__``), in a module of its own so that any layer can name
it without importing the package's top-level API."""

__version__ = "0.1.0"
