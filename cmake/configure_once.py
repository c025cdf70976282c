"""Configure a CMake build directory only when it has not been configured with exactly these arguments.

    python cmake/configure_once.py <build-dir> <stamp-name> [cmake configure args...]

Configuring again needlessly costs time. When the arguments change (maybe the generator too), the cache is cleared
and the objects kept, so the build stays as incremental as the new arguments allow.
setup.py imports configure(); ./dev runs this file.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def configure(build_dir: Path, stamp_name: str, args: list[str], log=print) -> bool:
    """Returns True when it ran cmake, False when build_dir was configured with `args` already."""
    stamp, cache = build_dir / stamp_name, build_dir / "CMakeCache.txt"
    wanted = "\n".join(args) + "\n"
    if cache.exists() and stamp.exists() and stamp.read_text() == wanted:
        log(f"{build_dir} is configured already; building incrementally")
        return False
    if cache.exists():
        log(f"configure arguments changed; clearing {cache}")
        cache.unlink()
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
    stamp.unlink(missing_ok=True)
    log("cmake " + " ".join(["-S", str(ROOT), "-B", str(build_dir), *args]))
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args], check=True, cwd=ROOT)
    stamp.write_text(wanted)
    return True


if __name__ == "__main__":
    configure(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
