"""Structured output (grammar-constrained decoding): the runtime patch that keeps raw
control characters out of schema-constrained JSON strings (``json_strings.py``)."""
