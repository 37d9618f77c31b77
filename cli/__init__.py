"""The ``diskreplay`` command line (installed as ``diskreplay.cli``)."""
