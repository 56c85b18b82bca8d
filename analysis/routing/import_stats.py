"""`analysis import-expert-stats DIR RUN`: an engine's own expert statistics attached to a run, for
its report (analysis/readers/expert_records.py): TensorRT-LLM's EXPERT_STATISTIC_PATH directory
(meta_info.json and rank*.safetensors), or SGLang's recorder dumps (a .pt file, or a directory of
expert_distribution_recorder_*.pt) from a server this machine cannot read while the run goes.
The files are copied into RUN/expert_records/ENGINE/ once they read."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from analysis.readers.expert_records import read_sglang, read_trtllm
from analysis.readers.rundir import RunDirError, load_run
from records.rundir import EXPERT_RECORDS


def engine_files(source: Path) -> tuple[str, list[Path]]:
    """(engine, its files) in source; RunDirError naming DIR when it holds neither."""
    if source.is_file() and source.suffix == ".pt":
        return "sglang", [source]
    if source.is_dir() and (source / "meta_info.json").exists():
        return "trtllm", [source / "meta_info.json", *sorted(source.glob("rank*.safetensors"))]
    if source.is_dir() and (dumps := sorted(source.glob("expert_distribution_recorder_*.pt"))):
        return "sglang", dumps
    raise RunDirError(f"DIR {source}: neither TensorRT-LLM's statistics (meta_info.json and "
                      "rank*.safetensors) nor SGLang's recorder dumps "
                      "(expert_distribution_recorder_*.pt)")


def add_command(commands) -> None:
    parser = commands.add_parser(
        "import-expert-stats", help="attach TensorRT-LLM's or SGLang's expert statistics to a run")
    parser.add_argument("source", metavar="DIR", help="EXPERT_STATISTIC_PATH, or SGLang's dumps")
    parser.add_argument("run_dir", metavar="RUN", help="the run directory to attach them to")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run = load_run(args.run_dir)
    engine, files = engine_files(Path(args.source))
    target = run.path / EXPERT_RECORDS / engine
    staged = target.with_name(f".{engine}.new")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for file in files:
        shutil.copy2(file, staged / file.name)
    records = (read_sglang if engine == "sglang" else read_trtllm)(staged)
    if not records.steps.size:
        shutil.rmtree(staged)
        raise RunDirError(f"DIR {args.source}: no statistics read: {'; '.join(records.unread)}")
    shutil.rmtree(target, ignore_errors=True)
    staged.rename(target)
    print("\n".join(records.lines()))
    print(f"attached to {target}")
