"""A topology file's global sections (``[fabric]``, ``[link_defaults]``, ``[buffer]``,
``[pfc]``, ``[ecn]``, ``[dcqcn]``, ``[transport]``, ``[server]``): their defaults, the type of
every key, and the checks of their values; every error names the file, the key and the bad
value (the layout: :mod:`rocev2_emu.topology.file`).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from rocev2_emu.cc import PROFILES, DcqcnParams
from rocev2_emu.server.crossbar import DEFAULT_PRESET
from rocev2_emu.server.crossbar import PRESETS as SERVER_FABRICS
from rocev2_emu.topology.model import PAYLOADS, TopologyError, dcqcn_overrides
from switch.config import ECMP_MODES
from switch.mmu import BUFFER_MODES

_DEFAULTS: dict[str, dict[str, Any]] = {
    "fabric": {
        "name": "fabric",
        "tdf": 200.0,
        "seed": 1,
        "mtu": 4096,
        "subnet": "",
        "batch_io": True,
        "ecmp": "5-tuple",
        "payload": "real",
    },
    "link_defaults": {"rate_gbps": 100.0, "delay_us": 1.0, "loss": 0.0},
    "buffer": {
        "size_bytes": 12 * 2**20,
        "reserve_bytes": 4096,
        "headroom_bytes": 96 * 1024,
        "alpha": 0.125,
        "xoff_bytes": 0,
        "xon_offset_bytes": 8400,
        "mode": "shared",
    },
    "pfc": {
        "enabled": True,
        "lossless_priorities": [3],
        "quanta": 0xFFFF,
        "watchdog_detect_ms": 200.0,
        "watchdog_restore_ms": 200.0,
        "watchdog_action": "drop",
    },
    "ecn": {"enabled": True, "priorities": [3]},
    "dcqcn": {"enabled": True, "profile": "paper"},
    "server": {"fabric": DEFAULT_PRESET, "bandwidth_gbps": None, "latency_us": None},
    "transport": {"qp_timeout": 12, "retry_cnt": 7, "max_inflight": 4096, "pacing_gbps": 0.0},
}
_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "subnet": str,
    "tdf": (int, float),
    "seed": int,
    "mtu": int,
    "batch_io": bool,
    "ecmp": str,
    "payload": str,
    "rate_gbps": (int, float),
    "delay_us": (int, float),
    "loss": (int, float),
    "size_bytes": int,
    "reserve_bytes": int,
    "headroom_bytes": int,
    "alpha": (int, float),
    "xoff_bytes": int,
    "xon_offset_bytes": int,
    "mode": str,
    "enabled": bool,
    "lossless_priorities": list,
    "quanta": int,
    "watchdog_detect_ms": (int, float),
    "watchdog_restore_ms": (int, float),
    "watchdog_action": str,
    "priorities": list,
    "profile": str,
    "kmin_kb": (int, float),
    "kmax_kb": (int, float),
    "pmax": (int, float),
    "qp_timeout": int,
    "retry_cnt": int,
    "max_inflight": int,
    "pacing_gbps": (int, float),
    "fabric": str,
    "bandwidth_gbps": (int, float),
    "latency_us": (int, float),
}


def bad_value(path: str, key: str, value: Any, why: str) -> TopologyError:
    """The error for ``key = value`` of the file at ``path``, saying ``why``."""
    return TopologyError(f"{path}: {key} = {value!r}: {why}")


def sections(data: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    """Every section with its defaults filled in, each key and value checked."""
    fail = partial(bad_value, path)
    known = set(_DEFAULTS) | {"switch", "host", "link"}
    for key in data:
        if key not in known:
            raise fail(key, "...", f"unknown section (expected one of {sorted(known)})")
    sec: dict[str, dict[str, Any]] = {}
    for section, defaults in _DEFAULTS.items():
        given = data.get(section, {})
        if not isinstance(given, dict):
            raise fail(section, given, "must be a table")
        for key, value in given.items():
            full = f"[{section}].{key}"
            if section == "dcqcn" and key in DcqcnParams.__dataclass_fields__:
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise fail(full, value, "must be a number")
                if not math.isfinite(value):
                    raise fail(full, value, "must be a finite number")
                continue
            if key not in _TYPES or (key not in defaults and section != "ecn"):
                raise fail(full, value, "unknown key")
            if not isinstance(value, _TYPES[key]) or (
                isinstance(value, bool) and _TYPES[key] is not bool
            ):
                raise fail(full, value, f"wrong type {type(value).__name__}")
            if isinstance(value, float) and not math.isfinite(value):
                raise fail(full, value, "must be a finite number")
        sec[section] = {**defaults, **given}
    fab, ld, pfc, ecn = sec["fabric"], sec["link_defaults"], sec["pfc"], sec["ecn"]
    if not fab["tdf"] > 0:
        raise fail("[fabric].tdf", fab["tdf"], "must be > 0")
    if sec["buffer"]["mode"] not in BUFFER_MODES:
        raise fail("[buffer].mode", sec["buffer"]["mode"], f"must be one of {BUFFER_MODES}")
    if fab["ecmp"] not in ECMP_MODES:
        raise fail("[fabric].ecmp", fab["ecmp"], f"must be one of {', '.join(ECMP_MODES)}")
    if fab["payload"] not in PAYLOADS:
        raise fail("[fabric].payload", fab["payload"], f"must be one of {', '.join(PAYLOADS)}")
    if fab["mtu"] not in (256, 512, 1024, 2048, 4096):
        raise fail("[fabric].mtu", fab["mtu"], "must be one of 256, 512, 1024, 2048, 4096")
    for key in ("rate_gbps", "delay_us"):
        if ld[key] < 0:
            raise fail(f"[link_defaults].{key}", ld[key], "must be >= 0")
    if not 0 <= ld["loss"] <= 1:
        raise fail("[link_defaults].loss", ld["loss"], "must be a probability")
    for key in ("lossless_priorities",):
        if any(not isinstance(p, int) or not 0 <= p < 8 for p in pfc[key]):
            raise fail(f"[pfc].{key}", pfc[key], "priorities are integers 0..7")
    tr = sec["transport"]
    if not 1 <= tr["qp_timeout"] <= 31:
        raise fail("[transport].qp_timeout", tr["qp_timeout"], "must be 1..31")
    if not 0 <= tr["retry_cnt"] <= 7:
        raise fail("[transport].retry_cnt", tr["retry_cnt"], "must be 0..7")
    if tr["pacing_gbps"] < 0:
        raise fail("[transport].pacing_gbps", tr["pacing_gbps"], "must be >= 0 (0: off)")
    if pfc["watchdog_action"] not in ("drop", "forward"):
        raise fail("[pfc].watchdog_action", pfc["watchdog_action"], "must be drop or forward")
    if not 0 <= pfc["quanta"] <= 0xFFFF:
        raise fail("[pfc].quanta", pfc["quanta"], "must be 0..65535")
    srv = sec["server"]
    if srv["fabric"] not in SERVER_FABRICS:
        raise fail("[server].fabric", srv["fabric"], f"must be one of {', '.join(SERVER_FABRICS)}")
    for key in ("bandwidth_gbps", "latency_us"):
        if srv[key] is not None and srv[key] < 0:
            raise fail(f"[server].{key}", srv[key], "must be >= 0")
    if srv["fabric"] == "free" and srv["bandwidth_gbps"]:
        raise fail("[server].bandwidth_gbps", srv["bandwidth_gbps"], "a free fabric has none")
    dq = sec["dcqcn"]
    if dq["profile"] not in PROFILES:
        raise fail("[dcqcn].profile", dq["profile"], f"must be one of {sorted(PROFILES)}")
    try:
        PROFILES[dq["profile"]].with_overrides(**dcqcn_overrides(dq))
    except (TypeError, ValueError) as exc:
        raise fail("[dcqcn]", dcqcn_overrides(dq), str(exc)) from exc
    if ("kmin_kb" in ecn) != ("kmax_kb" in ecn) or ecn.get("kmin_kb", 0) > ecn.get("kmax_kb", 1):
        raise fail("[ecn].kmin_kb", ecn.get("kmin_kb"), "needs kmax_kb, and kmin_kb <= kmax_kb")
    return sec
