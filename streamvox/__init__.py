"""StreamVox: a real-time streaming speech engine."""

__version__ = "0.1.0"
