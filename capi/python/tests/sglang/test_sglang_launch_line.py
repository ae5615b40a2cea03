"""The README's SGLang command line, read the way SGLang reads it: its own argument parser, its own
extra-config parsing, then our backend's config and pool layout for the host pool that line asks
for (Llama-3.1-8B at TP 2: 32 layers, 4 KV heads per rank, head dim 128, bf16, 64-token pages).
The server itself is not started (no GPU here)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch

import sglang_env as E
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.server_args import ServerArgs

from tutti._hicache import config
from tutti._hicache.layout import from_host_pool
from tutti.sglang import TuttiHiCacheStorage

README = Path(__file__).resolve().parents[4] / "README.md"
MARK = "<!-- sglang-launch:"


def _launch_args() -> list[str]:
    text = README.read_text()
    block = text[text.index(MARK):]
    block = block[block.index("```sh") + len("```sh"): block.index("```", block.index("```sh") + 5)]
    # The command is the rest of the block (its JSON argument spans lines inside its quotes).
    cmd = block.replace("\\\n", " ")
    words = shlex.split(cmd[cmd.index("python -m sglang.launch_server"):])
    return words[words.index("sglang.launch_server") + 1:]


def test_the_readme_command_line_is_one_sglang_and_the_backend_accept():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(_launch_args())
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(args.hicache_storage_backend_extra_config)
    assert (extra["module_path"], extra["class_name"]) == ("tutti.sglang", "TuttiHiCacheStorage")
    module = __import__(extra["module_path"], fromlist=[extra["class_name"]])
    assert getattr(module, extra["class_name"]) is TuttiHiCacheStorage
    cfg = config.parse(extra, tp_size=args.tp_size, pp_size=args.pp_size)
    assert cfg.interface_v1 and cfg.daemon == "auto"
    assert cfg.daemon_socket == str(Path(extra["emulated_dir"]) / "tuttid.sock")
    # The host pool that line makes on each rank, and its registration.
    dev = E.device_pool(tokens=2 * args.page_size, page=args.page_size, layers=32, heads=8 // args.tp_size,
                        head_dim=128, dtype=torch.bfloat16)
    host = E.host_pool(dev, args.hicache_mem_layout, ratio=1.0)
    layout = from_host_pool(host)
    g = layout.geometry
    assert (g.layers, g.kv_heads, g.head_dim, g.tokens_per_block) == (1, 32 * 4, 128, 64)
    assert g.object_bytes == 2 << 20 and layout.page_bytes == 4 << 20
    # The pool must hold pages: 2 drives × 32 GiB of 4 MiB pages.
    assert 2 * cfg.emulated_capacity_bytes // layout.page_bytes > 16_000
    json.dumps(extra)  # plain JSON, as SGLang hands it over
