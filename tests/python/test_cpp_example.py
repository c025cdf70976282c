"""examples/cpp built against the installed package (find_package(tunedist)), run as two processes.

Checks the C++ distribution end to end: headers, libtunedist.so and the CMake package installed by
`pip install --no-build-isolation .`, and a LibTorch program that all-reduces over them without leaking shared memory.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None,
                                reason="cmake is not installed; it is needed to build examples/cpp")

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "cpp"
WORLD_SIZE = 2
RUN_TIMEOUT_S = 120
SHM_DIR = Path("/dev/shm")


def _run_checked(cmd, what):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed with exit code {proc.returncode}: {' '.join(map(str, cmd))}\n"
                    f"{proc.stdout[-6000:]}", pytrace=False)


@pytest.fixture(scope="module")
def example_binary(tmp_path_factory):
    import torch.utils

    import tunedist

    build_dir = tmp_path_factory.mktemp("cpp_example_build")
    prefix_path = ";".join([tunedist.cmake_prefix_path, torch.utils.cmake_prefix_path])
    configure = ["cmake", "-S", str(EXAMPLE_DIR), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={prefix_path}",
                 "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ninja"):
        configure.append("-GNinja")
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    _run_checked(configure, "configuring examples/cpp against the installed tunedist")
    _run_checked(["cmake", "--build", str(build_dir), "--parallel", str(os.cpu_count() or 1)],
                 "building examples/cpp")
    binary = build_dir / "allreduce_example"
    assert binary.is_file(), f"the build produced no {binary}"
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tunedist_shm_entries() -> set:
    return {e for e in os.listdir(SHM_DIR) if e.startswith("tunedist_")} if SHM_DIR.is_dir() else set()


def _launch(binary: Path, store: str) -> list:
    procs = [subprocess.Popen([str(binary), str(rank), str(WORLD_SIZE), store], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(WORLD_SIZE)]
    results = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((rank, proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [proc.communicate() for proc in procs]
        report = "\n".join(f"--- rank {r} stdout:\n{o}\n--- rank {r} stderr:\n{e}" for r, (o, e) in enumerate(outputs))
        pytest.fail(f"allreduce_example did not finish within {RUN_TIMEOUT_S} s\n{report}", pytrace=False)
    return results


@pytest.mark.parametrize("store_kind", [pytest.param("file", id="filestore"), pytest.param("tcp", id="tcpstore")])
def test_cpp_example_allreduce(example_binary, store_kind, tmp_path):
    store = str(tmp_path / "store") if store_kind == "file" else str(_free_port())
    shm_before = _tunedist_shm_entries()

    results = _launch(example_binary, store)

    for rank, returncode, out, err in results:
        assert returncode == 0 and "allreduce ok" in out, (
            f"rank {rank} exited with {returncode}\n--- stdout:\n{out}\n--- stderr:\n{err}")

    # The example's segments must be gone. Entries that were there before this test are not ours. Another job on
    # this host may briefly hold a segment of its own, so wait for a new entry to go away before calling it a leak.
    leaked = _tunedist_shm_entries() - shm_before
    for _ in range(20):
        if not leaked:
            break
        time.sleep(0.1)
        leaked &= _tunedist_shm_entries()
    assert not leaked, f"shared memory left behind in {SHM_DIR}: {sorted(leaked)}"
