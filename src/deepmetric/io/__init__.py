"""The bottom of the house, one job a module: ``files`` (writing files that must never be half-written),
``strict`` (strict JSON and YAML, written and read back) and ``tensors`` (flat tensor dicts for checkpoints).

Nothing here imports the rest of deepmetric but its errors: every floor may use it.
"""
