"""Ship the CUDA sources of the top-level `kernels/` folder inside the wheel as `workbench/_kernels`."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        src = Path(__file__).parent / "kernels"
        dst = Path(self.build_lib) / "workbench" / "_kernels"
        dst.mkdir(parents=True, exist_ok=True)
        for path in src.glob("*"):
            if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
                shutil.copy2(path, dst / path.name)


setup(cmdclass={"build_py": BuildPyWithKernels})
