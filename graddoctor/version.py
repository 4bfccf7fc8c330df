"""graddoctor's version, on the lowest floor: the reports name the tool that wrote them, and the
package's ``__init__`` (a front door) re-exports it as ``graddoctor.__version__``."""

__version__ = "0.1.0"
