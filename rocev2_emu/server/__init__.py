"""The inside of a server: the fabric that joins its accelerators (NVLink through NVSwitch, or
PCIe), as a crossbar of per-accelerator ports (:mod:`~rocev2_emu.server.crossbar`) driven on the
host's emulated clock (:mod:`~rocev2_emu.server.fabric`)."""
