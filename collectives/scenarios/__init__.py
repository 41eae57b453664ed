"""The collective scenarios (``rocev2-emu scenario NAME``), each with its job, report, checks
and plot: ``straggler``, ``ecmp-entropy``, ``admission`` and ``spine-failure``."""
