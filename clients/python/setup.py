"""Builds the package, generating its gRPC stubs from latchkey's contract.

The stubs come from ``crates/latchkey-proto/proto/latchkey.proto`` of the
same checkout (two directories up), generated with grpcio-tools into
``latchkey/_proto`` of the build, so ``pip install ./clients/python`` from a
clone always speaks the contract of that clone. Set ``LATCHKEY_PROTO`` to
the .proto file to build from elsewhere.
"""

import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_PROTO = HERE.parent.parent / "crates" / "latchkey-proto" / "proto" / "latchkey.proto"


class BuildWithStubs(build_py):
    """build_py, then grpc_tools.protoc into the build's latchkey/_proto."""

    def run(self):
        super().run()
        proto = pathlib.Path(os.environ.get("LATCHKEY_PROTO", DEFAULT_PROTO)).resolve()
        if not proto.is_file():
            raise SystemExit(
                f"latchkey: the contract {proto} is missing: build this package from a "
                "latchkey checkout (pip install ./clients/python), or set LATCHKEY_PROTO "
                "to latchkey.proto"
            )
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        include = pathlib.Path(protoc.__file__).parent / "_proto"
        out = pathlib.Path(self.build_lib)
        # Map the file to latchkey/_proto/ so the generated modules import
        # each other as latchkey._proto.latchkey_pb2.
        args = [
            "grpc_tools.protoc",
            f"-I{include}",
            f"-Ilatchkey/_proto={proto.parent}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            f"latchkey/_proto/{proto.name}",
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"latchkey: grpc_tools.protoc failed on {proto}")


setup(cmdclass={"build_py": BuildWithStubs})
