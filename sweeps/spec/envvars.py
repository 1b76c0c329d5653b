"""The communication variables a spec may set (`env`, `env_grid`), and which of them are more than tuning.

NCCL passes NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN and NCCL_ENV_PLUGIN to dlopen (a path
works: NCCL's plugin loader), NCCL_DEBUG_FILE, NCCL_TOPO_DUMP_FILE, NCCL_GRAPH_DUMP_FILE and
TORCH_NCCL_DEBUG_INFO_TEMP_FILE write files at a path the value names, and NCCL_TOPO_FILE, NCCL_GRAPH_FILE and
NCCL_CONF_FILE read one. A sweep over HTTP may set only the tuning variables below (everything else is a 403
unless the server was started with `--allow-env NAME`); the CLI runs anything (the user's own machine) and warns
in one line for a variable that loads code or touches files.
"""

from __future__ import annotations

# Variables that change how NCCL, gloo or PyTorch's process group communicate, and nothing else: what a
# communication sweep measures (algorithm, protocol, channels, buffers, transports, interfaces, timeouts).
TUNING = frozenset(
    {
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_CTAS",
        "NCCL_MAX_CTAS",
        "NCCL_NTHREADS",
        "NCCL_BUFFSIZE",
        "NCCL_P2P_LEVEL",
        "NCCL_P2P_DISABLE",
        "NCCL_P2P_NET_CHUNKSIZE",
        "NCCL_SHM_DISABLE",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_NET_GDR_READ",
        "NCCL_CROSS_NIC",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_IB_TC",
        "NCCL_IB_SL",
        "NCCL_IB_TIMEOUT",
        "NCCL_IB_RETRY_CNT",
        "NCCL_SOCKET_IFNAME",
        "NCCL_SOCKET_NTHREADS",
        "NCCL_NSOCKS_PERTHREAD",
        "NCCL_CUMEM_ENABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_COLLNET_ENABLE",
        "NCCL_LAUNCH_MODE",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "GLOO_SOCKET_IFNAME",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_BLOCKING_WAIT",
        "TORCH_NCCL_AVOID_RECORD_STREAMS",
        "TORCH_NCCL_HIGH_PRIORITY",
        "TORCH_NCCL_USE_COMM_NONBLOCKING",
    }
)
LOADS_CODE = frozenset({"NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN"})
TOUCHES_FILES = frozenset(
    {
        "NCCL_DEBUG_FILE",
        "NCCL_TOPO_DUMP_FILE",
        "NCCL_GRAPH_DUMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "NCCL_TOPO_FILE",
        "NCCL_GRAPH_FILE",
        "NCCL_CONF_FILE",
    }
)


def names(env: dict, env_grid: dict) -> list[str]:
    """Every variable a spec sets, with the field it is set in (`env.X`, `env_grid.X`)."""
    return [f"env.{k}" for k in env] + [f"env_grid.{k}" for k in env_grid]


def refused_over_http(env: dict, env_grid: dict, allowed: tuple[str, ...] = ()) -> list[str]:
    """The fields of a submitted spec that set a variable beyond TUNING and the server's `--allow-env` names."""
    return [path for path in names(env, env_grid) if path.partition(".")[2] not in TUNING | set(allowed)]


def warning(name: str) -> str | None:
    """One line for a variable that loads code or touches files (None: tuning only, as far as known)."""
    if name in LOADS_CODE:
        return f"{name} makes NCCL load a shared library from the path it names (dlopen): code runs on every worker"
    if name in TOUCHES_FILES:
        return f"{name} makes NCCL or PyTorch read or write a file at the path it names on every worker"
    return None
