"""Report formats: one module each, ``render(report, options) -> str``. They never decide."""
