"""Generate the Python gRPC stubs from the .proto files kept in the repo.

Run as `python -m stowage.genprotos` (the Makefile's `protos` step). Protos are compiled with
the repository root as include path, so generated modules import each other by their package
path (``deviceplugin.v1beta1.api_pb2``) and two protos both named ``api.proto`` never clash.
:func:`ensure` regenerates a stub that is missing or older than its .proto, so an import never
fails on a fresh checkout that skipped the make step.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROTOS = [
    "deviceplugin/v1beta1/api.proto",
    "gpunode/podresources/api.proto",
]


def _outputs(proto: Path) -> list[Path]:
    stem = proto.with_suffix("")
    return [stem.parent / f"{stem.name}_pb2.py", stem.parent / f"{stem.name}_pb2_grpc.py"]


def generate(proto_rel: str) -> None:
    from grpc_tools import protoc  # grpcio-tools; imported here so runtime imports stay light
    import importlib.resources

    proto = ROOT / proto_rel
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    args = ["grpc_tools.protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={ROOT}",
            f"--grpc_python_out={ROOT}", str(proto)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto_rel}")


def ensure(proto_rel: str) -> None:
    """Generate the stubs of one proto if missing or stale."""
    proto = ROOT / proto_rel
    outs = _outputs(proto)
    if all(o.exists() and o.stat().st_mtime >= proto.stat().st_mtime for o in outs):
        return
    generate(proto_rel)


def main() -> int:
    for rel in PROTOS:
        if (ROOT / rel).exists():
            generate(rel)
            print(f"generated stubs for {rel}")
        else:
            print(f"skipped {rel} (not present)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
