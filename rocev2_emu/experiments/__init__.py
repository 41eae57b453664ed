"""The canonical congestion experiments (``rocev2-emu scenario NAME``): a small harness,
one module per scenario, and the DCQCN fluid model they are checked against."""
