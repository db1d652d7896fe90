"""The documentation, the import graph, packaging and pins, checked against the code."""
