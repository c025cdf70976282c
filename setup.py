"""Build and install tunedist by driving CMake. CMakeLists.txt is the only build definition.

    pip install --no-build-isolation .

Use --no-build-isolation because the extension has to be compiled against the torch that is already installed
(torch's C++ ABI changes with every release). Build isolation would download a second torch for the build.

What a build does:
  1. Configure build/py-<X.Y> once, and again only when the arguments below change (cmake/configure_once.py).
     CMake re-runs itself when CMakeLists.txt changes, so later installs are incremental (ccache speeds them up).
  2. cmake --build: targets _C (the module tunedist._C) and tunedist (libtunedist.so).
  3. cmake --install into the package directory tunedist/:
       _C.<abi>.so and libtunedist.so    (_C finds the library through RPATH $ORIGIN)
       include/tunedist/*.h              (the C++ API)
       share/cmake/tunedist/*.cmake      (find_package(tunedist); see tunedist.cmake_prefix_path)

Environment:
  TUNEDIST_USE_NCCL      1/0: build the NCCL side for CUDA tensors or not (default: CMake decides; ON when torch has
                         CUDA and the NCCL headers are found; see cmake/tunedistNccl.cmake)
  TUNEDIST_CMAKE_ARGS    extra configure arguments, e.g. "-DTUNEDIST_NCCL_INCLUDE_DIR=/opt/nccl/include"
  TUNEDIST_BUILD_TYPE    CMAKE_BUILD_TYPE (default Release)
  MAX_JOBS               parallel compile jobs (default: the number of CPUs)
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MIN_TORCH = (2, 11)  # keep in step with pyproject.toml's dependencies


def project_version() -> str:
    """The version in CMakeLists.txt's project() call, so the version is written down in one place only."""
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*tunedist\s+VERSION\s+([0-9][0-9.]*)", text)
    if match is None:
        raise RuntimeError("setup.py: no 'project(tunedist VERSION x.y.z' in CMakeLists.txt")
    return match.group(1)


class CMakeExtension(Extension):
    """An extension that CMake builds. It carries no sources because CMakeLists.txt lists them."""

    def __init__(self, name: str, targets: list[str]):
        super().__init__(name, sources=[])
        self.targets = targets


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        if shutil.which("cmake") is None:
            raise RuntimeError("setup.py: cmake not found; install it (apt-get install cmake, or pip install cmake)")
        try:
            import torch.utils
        except ImportError as e:
            raise RuntimeError(
                "setup.py: torch must be installed before tunedist is built, and the build must see it: "
                "pip install torch, then pip install --no-build-isolation .") from e
        torch_version = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
        if torch_version < MIN_TORCH:
            raise RuntimeError(f"setup.py: tunedist needs torch >= {'.'.join(map(str, MIN_TORCH))}; "
                               f"this Python has torch {torch.__version__}")

        build_dir = ROOT / "build" / f"py-{sys.version_info.major}.{sys.version_info.minor}"
        # The package directory in the build tree (or in the source tree for an in-place build).
        package_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        package_dir.mkdir(parents=True, exist_ok=True)

        configure_args = [
            f"-DCMAKE_BUILD_TYPE={os.environ.get('TUNEDIST_BUILD_TYPE', 'Release')}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            "-DTUNEDIST_BUILD_PYTHON=ON",
            "-DTUNEDIST_BUILD_TESTS=OFF",
            # The library goes next to _C, and the CMake package inside the Python package.
            "-DCMAKE_INSTALL_LIBDIR=.",
            "-DTUNEDIST_INSTALL_CMAKEDIR=share/cmake/tunedist",
        ]
        use_nccl = os.environ.get("TUNEDIST_USE_NCCL", "").strip().lower()
        if use_nccl:
            if use_nccl not in ("1", "0", "on", "off", "true", "false", "yes", "no"):
                raise RuntimeError(f"setup.py: TUNEDIST_USE_NCCL={use_nccl!r}; use 1 or 0")
            configure_args.append(f"-DTUNEDIST_USE_NCCL={'ON' if use_nccl in ('1', 'on', 'true', 'yes') else 'OFF'}")
        if "CMAKE_GENERATOR" not in os.environ and shutil.which("ninja"):
            configure_args.append("-GNinja")
        configure_args += shlex.split(os.environ.get("TUNEDIST_CMAKE_ARGS", ""))
        self._configure(build_dir, configure_args)

        jobs = os.environ.get("MAX_JOBS") or str(self.parallel or os.cpu_count() or 1)
        self._run(["cmake", "--build", str(build_dir), "--target", *ext.targets, "--parallel", jobs])
        self._run(["cmake", "--install", str(build_dir), "--prefix", str(package_dir)])
        self._run(["cmake", "--install", str(build_dir), "--prefix", str(package_dir), "--component", "python"])

        built = Path(self.get_ext_fullpath(ext.name))
        if not built.exists():
            raise RuntimeError(f"setup.py: cmake --install did not produce {built}; "
                               f"found {sorted(p.name for p in package_dir.iterdir())}")

    def _configure(self, build_dir: Path, args: list[str]) -> None:
        """Configure only when build_dir has not been configured with exactly these arguments (cmake/configure_once.py,
        which ./dev uses for its build folders too)."""
        sys.path.insert(0, str(ROOT / "cmake"))
        try:
            from configure_once import configure
        finally:
            sys.path.pop(0)
        configure(build_dir, "setup-py-configure-args.txt", args, log=lambda m: print(f"setup.py: {m}", flush=True))

    @staticmethod
    def _run(cmd: list[str]) -> None:
        print("setup.py: " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)


setup(
    version=project_version(),
    package_dir={"": "python"},
    packages=find_packages(where="python"),
    ext_modules=[CMakeExtension("tunedist._C", targets=["_C", "tunedist"])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
