"""Ship the top-level folders that are package data but not Python: `kernels/` (the CUDA sources) as
`workbench/_kernels` and `experiments/` (the built-in sweep specs) as `workbench/_experiments`."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# top-level folder -> (folder inside the package, the file suffixes it ships)
SHIPPED = {
    "kernels": ("_kernels", (".cu", ".cuh", ".h", ".cpp")),
    "experiments": ("_experiments", (".yaml",)),
}


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        for folder, (inside, suffixes) in SHIPPED.items():
            src = Path(__file__).parent / folder
            dst = Path(self.build_lib) / "workbench" / inside
            dst.mkdir(parents=True, exist_ok=True)
            for path in src.glob("*"):
                if path.suffix in suffixes:
                    shutil.copy2(path, dst / path.name)


setup(cmdclass={"build_py": BuildPyWithData})
