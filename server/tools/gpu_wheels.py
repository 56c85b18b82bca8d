"""`python -m server.tools.gpu_wheels` (`make gpu-wheels`): the packages a GPU machine without a
network lacks for gpu-check and gpu-bench, as wheels for its Python, downloaded here.

The machine has a CUDA PyTorch and its scientific stack (docs/measured.md, "On a GPU"); it lacks
the gRPC packages at this project's versions, Locust and everything Locust pulls in, hdrhistogram,
aiohttp (the server's HTTP front end) and the engines' gRPC stubs. Their closure is read from this
environment's installed metadata (the versions this project tests with), the requirements'
markers judged for the target Python on x86-64 Linux, less what the machine has; each is
downloaded as a binary wheel for that Python. Prints the names, then where they went.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

from records.cli import Parser

ROOTS = ("locust", "hdrhistogram", "grpcio", "grpcio-tools", "grpcio-health-checking",
         "grpcio-reflection", "protobuf", "aiohttp", "smg-grpc-proto", "tritonclient")
# what the GPU machine has already (docs/measured.md), its own builds kept
PRESENT = {"torch", "numpy", "transformers", "pytest", "psutil", "nvidia-ml-py", "matplotlib",
           "scipy", "prometheus-client", "safetensors", "tokenizers", "setuptools", "pip",
           "packaging", "typing-extensions", "jinja2", "markupsafe", "requests", "urllib3",
           "idna", "certifi", "charset-normalizer", "filelock", "fsspec", "networkx", "sympy",
           "mpmath", "pyyaml", "huggingface-hub", "tqdm", "regex"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...], python: str) -> dict[str, str]:
    """name -> installed version of every root and its requirements, recursively, as this
    environment has them, their markers judged for Python `python` on Linux."""
    env = default_environment() | {"python_version": python, "python_full_version": f"{python}.0",
                                   "sys_platform": "linux", "platform_system": "Linux",
                                   "platform_machine": "x86_64"}
    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonical(todo.pop())
        if name in found or name in PRESENT:
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env | {"extra": ""}):
                todo.append(req.name)
    return found


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m server.tools.gpu_wheels",
                                description=__doc__.split("\n")[0])
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python, X.Y")
    p.add_argument("--dest", default=".whl", help="where the wheels go")
    options = p.parse_args(argv)
    wanted = closure(ROOTS, options.python_version)
    print(" ".join(f"{n}=={v}" for n, v in sorted(wanted.items())))
    platforms = [arg for platform in (*PLATFORMS, "any") for arg in ("--platform", platform)]
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--only-binary=:all:", "--python-version", options.python_version,
                           "--implementation", "cp", *platforms, "-d", options.dest,
                           *(f"{n}=={v}" for n, v in sorted(wanted.items()))])
    if done.returncode:
        return done.returncode
    wheels = sorted(Path(options.dest).glob("*.whl"))
    size_mb = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size_mb:.0f} MB, in {options.dest}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
