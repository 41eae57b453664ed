"""``python -m rocev2_emu``: the same as the ``rocev2-emu`` console script."""

from rocev2_emu.cli import main

raise SystemExit(main())
