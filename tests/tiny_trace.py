"""A few-line openb trace in a temporary folder, for benchmark commands run without the real one.

The benchmark commands read ``--data-dir``: the node list and one pod list per trace name. The
real trace (../shared/openb) is not on every machine and takes seconds per seed; what a test of
a command's own behaviour (its tables, its Ctrl-C) needs is a trace it can replay at once.
"""
from __future__ import annotations

from pathlib import Path


def write_trace(folder: Path, nodes: int, pods: int, gpu_milli: int = 1000, trace: str = "default") -> Path:
    """``folder`` with ``nodes`` 8-GPU V100 nodes and ``pods`` one-GPU pods of ``gpu_milli`` each
    as the trace ``trace``; returns ``folder`` (created if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},64000,262144,8,V100M32\n" for i in range(nodes)))
    (folder / f"openb_pod_list_{trace}.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i},1000,1024,1,{gpu_milli}\n" for i in range(pods)))
    return folder
