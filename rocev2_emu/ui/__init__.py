"""The live map of a fabric in the browser (``rocev2-emu up --ui``) and replays of recorded
runs (``rocev2-emu view FILE``): :mod:`~rocev2_emu.ui.sampler` reads the nodes,
:mod:`~rocev2_emu.ui.server` serves the page (``page.html``) and the samples.  Needs the
``ui`` extra (starlette, hypercorn)."""
