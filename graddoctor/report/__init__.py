"""Report formats, one module each: text (rich terminal view), json_format (with its JSON Schema,
report.schema.json), sarif (SARIF 2.1.0). They render a Report; they never decide. formats.py
puts them behind one interface (``name``, ``render(report, options)``) and one registry,
``FORMATS``, which the CLI dispatches through."""

from . import formats  # noqa: F401  (attaches the formats to Report: render(), to_json(), ...)
