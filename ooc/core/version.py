"""The package version (here so that any module can read it without importing ``ooc``)."""

__version__ = "0.1.0"
