"""Static cost of the attention kernel's main loop, read from its SASS (no GPU needed).

The kernels are compiled with NVRTC for sm_90 with the ptxas report (registers, spills); the CUBIN
is disassembled with `cuobjdump -sass`. The main loop is the innermost backward branch whose body
holds the vector K/V loads (LDG.E.128, or LDG.E.64 for 8-byte vectors; the page-table reads
are 32-bit); its bytes per trip are those loads × their width × 32 lanes, so instructions per KV byte is what one
warp issues per byte it streams. A static count: branches inside the body count once, which is
what a full tile (the common case) executes, give or take the masked tail.

Per *unique* KV byte: when a block spreads its rows over several warps that walk the same positions
(ROWS / WARP_ROWS of them; attention.cu's Tiling, mirrored by `warps_per_kv_byte`), each byte is loaded and
converted by every one of them, so the block issues that many times the per-byte cost for each byte it needs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from workbench.kernels import launch, nvrtc, source

_INSTRUCTION = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<text>[^;]*);")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?0x(?P<target>[0-9a-f]+)")
_FUNCTION = re.compile(r"Function : (?P<name>\S+)")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
KV_LOAD_BYTES = {"LDG.E.128": 16 * 32, "LDG.E.64": 8 * 32}  # one vector load per lane of a warp
# The latent (MLA) kernel reads a token's row with one warp, one element per lane and load (mla_attention.cu):
# its main loop is the innermost loop holding loads of the element's width, 32 lanes × its bytes per load.
# (fp32 rows load with the same 32-bit instruction as the float query: only 2- and 1-byte dtypes are told apart.)
MLA_LOAD_BYTES = {"__half": {"LDG.E.U16": 2 * 32}, "__nv_bfloat16": {"LDG.E.U16": 2 * 32},
                  "kvw::Fp8E4M3": {"LDG.E.U8": 32}}


@dataclass(frozen=True)
class LoopCost:
    kernel: str
    registers: int
    spill_bytes: int
    loop_instructions: int
    kv_bytes_per_trip: int
    warps_per_kv_byte: int  # warps of a block that load the same KV bytes

    @property
    def instructions_per_kv_byte(self) -> float:
        return self.loop_instructions / self.kv_bytes_per_trip if self.kv_bytes_per_trip else float("nan")

    @property
    def instructions_per_unique_kv_byte(self) -> float:
        return self.instructions_per_kv_byte * self.warps_per_kv_byte


_TYPE_BYTES = {"float": 4, "__half": 2, "__nv_bfloat16": 2, "kvw::Fp8E4M3": 1}


def lane_elements(type_bytes: int, head_dim: int, rows: int, max_lane_row_values: int) -> int:
    """Elements of a head row one lane holds: the load vector (kv_common.cuh's RowVec, mirrored by
    `launch.vector_bytes`, at most max_lane_row_values / rows elements as attention.cu's Tiling asks) times
    attention.cu's VECS (vectors per lane of a power-of-two lane group)."""
    vector = min(launch.vector_bytes(head_dim, type_bytes) // type_bytes, max_lane_row_values // rows)
    per_row = head_dim // vector
    group = min(1 << (per_row - 1).bit_length(), 32)
    return -(-per_row // group) * vector


def warps_per_kv_byte(expression: str, attention_source: str) -> int:
    """Warps of one block that walk the same KV positions: ROWS over the rows one warp keeps, which is
    attention.cu's MAX_LANE_ROW_VALUES over the elements a lane holds per row, capped at ROWS."""
    type_name, head_dim, rows = (part.strip(" >") for part in expression.split("<", 1)[1].rsplit(",", 2))
    found = re.search(r"constexpr int MAX_LANE_ROW_VALUES = (\d+);", attention_source)
    if not found:
        raise SystemExit("attention.cu: MAX_LANE_ROW_VALUES not found; warps per KV byte unknown")
    max_values = int(found[1])
    lane_values = lane_elements(_TYPE_BYTES[type_name], int(head_dim), int(rows), max_values)
    warp_rows = min(int(rows), max_values // lane_values)
    return int(rows) // warp_rows


def find_tool(name: str) -> str | None:
    """`name` on PATH, in $CUDA_HOME/bin, or in the nvidia-cuda-* 13 wheels' bin folder."""
    found = shutil.which(name)
    if found:
        return found
    folders = [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    try:
        import nvidia.cu13

        folders += [Path(p) / "bin" for p in nvidia.cu13.__path__]
    except ImportError:
        pass
    folders.append(Path("/usr/local/cuda/bin"))
    return next((str(f / name) for f in folders if (f / name).is_file()), None)


def split_functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass text → {mangled name: [(address, instruction text)]}."""
    functions, current = {}, None
    for line in sass.splitlines():
        if found := _FUNCTION.search(line):
            current = functions.setdefault(found["name"], [])
        elif current is not None and (ins := _INSTRUCTION.match(line)):
            current.append((int(ins["addr"], 16), ins["text"].strip()))
    return functions


def main_loop(instructions: list[tuple[int, str]], load_bytes: dict[str, int] = KV_LOAD_BYTES,
              predicated: bool = False) -> tuple[int, int]:
    """(instructions, KV bytes per warp) of the innermost loop that holds KV loads (`load_bytes`: opcode → bytes
    a warp loads with it; `predicated`: count loads under a predicate too); (0, 0) when there is none."""
    best = (0, 0)
    for addr, text in instructions:
        branch = _BRANCH.search(text)
        if not branch or int(branch["target"], 16) > addr:
            continue
        body = [t for a, t in instructions if int(branch["target"], 16) <= a <= addr and not t.startswith("NOP")]
        opcodes = [_PREDICATE.sub("", t) if predicated else t for t in body]
        loads = sum(size for t in opcodes for op, size in load_bytes.items() if t.startswith(op))
        if loads and (best == (0, 0) or len(body) < best[0]):
            best = (len(body), loads)
    return best


def loop_costs(expressions: list[str], arch: str = "sm_90", nvcc: str | None = None,
               source_name: str = source.ATTENTION_CU) -> list[LoopCost]:
    """One NVRTC compilation of `expressions` (attention kernels of `source_name`), or with `nvcc` (a path) one
    nvcc compilation from the same options, and the loop cost of each."""
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        raise SystemExit("cuobjdump not found (a CUDA toolkit, or pip install nvidia-cuda-cuobjdump "
                         "nvidia-cuda-nvdisasm): --sass needs it")
    if nvcc:
        module = nvrtc.nvcc_cubin(nvcc, source_name, expressions, arch)
    else:
        module = nvrtc.compile_cubin(source_name, expressions, arch)
    env = dict(os.environ)
    if nvdisasm := find_tool("nvdisasm"):
        env["PATH"] = f"{Path(nvdisasm).parent}{os.pathsep}{env.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "attention.cubin"
        cubin.write_bytes(module.cubin)
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True,
                              env=env).stdout
    functions = split_functions(sass)
    attention_text = source.read_source(source.ATTENTION_CU)
    costs = []
    for expression in expressions:
        mangled = module.lowered_names[expression]
        report = module.resources[mangled]
        latent = source_name == source.MLA_CU
        loads = MLA_LOAD_BYTES[expression.split("<", 1)[1].split(",", 1)[0]] if latent else KV_LOAD_BYTES
        # the latent kernel's row loads sit under the tile's "token exists" predicate
        count, kv_bytes = main_loop(functions.get(mangled, []), loads, predicated=latent)
        # a latent block loads each row once for all its heads, with one pass of its warps
        warps = 1 if latent else warps_per_kv_byte(expression, attention_text)
        costs.append(LoopCost(expression, report.registers, report.spill_store_bytes + report.spill_load_bytes,
                              count, kv_bytes, warps))
    return costs


def print_table(expressions: list[str], nvcc: str | None = None) -> None:
    """The loop cost of each expression whose KV type the checkout's kernels know (so an older
    checkout, run with PYTHONPATH pointing at it, prints its own "before" rows)."""
    known = set(source.CUDA_KV_TYPES.values())
    expressions = [e for e in expressions if e.split("<", 1)[1].split(",", 1)[0] in known]
    compiler = f"nvcc {nvcc}" if nvcc else f"NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))}"
    print(f"SASS of the attention main loop ({compiler}, sm_90, {' '.join(nvrtc.CODEGEN_OPTIONS)}); "
          f"kernels from {source.kernels_dir()}")
    print(f"{'kernel':<54} {'regs':>5} {'spill_B':>7} {'loop_instr':>10} {'KV_B/trip':>9} {'instr/KV_B':>10} "
          f"{'warps/B':>7} {'instr/uniq_B':>12}")
    rows = loop_costs(expressions, nvcc=nvcc)
    if hasattr(source, "MLA_CU"):  # the dense paged latent kernels, where the checkout has them
        latent = [e for e in source.all_mla_kernel_names() if e.startswith("kvw::paged") and e.endswith("false>")
                  and e.split("<", 1)[1].split(",", 1)[0] in MLA_LOAD_BYTES]
        rows += loop_costs(latent, nvcc=nvcc, source_name=source.MLA_CU)
    for c in rows:
        print(f"{c.kernel:<54} {c.registers:>5} {c.spill_bytes:>7} {c.loop_instructions:>10} "
              f"{c.kv_bytes_per_trip:>9} {c.instructions_per_kv_byte:>10.3f} {c.warps_per_kv_byte:>7} "
              f"{c.instructions_per_unique_kv_byte:>12.3f}")
