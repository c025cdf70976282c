#!/usr/bin/env bash
# One-off diagnosis of the import segfault on the GPU machine (session 21; see README.md).
set -u
ROOT=$(pwd); O=${OUT:-/tmp/diagout}; mkdir -p $O
exec > >(tee $O/diag.txt) 2>&1
PY=python3
PREFIX=$($PY -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
conf() { # dir extra-args
  cmake -S $ROOT -B /tmp/b$1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
    -DPython_EXECUTABLE=$(command -v $PY) -DTUNEDIST_BUILD_TESTS=OFF "${@:2}" > /tmp/conf$1.log 2>&1 &&
  cmake --build /tmp/b$1 --target _C tunedist --parallel 8 > /tmp/build$1.log 2>&1
  echo "build $1 rc=$?"; tail -3 /tmp/build$1.log
  mkdir -p /tmp/py$1 && cp -r $ROOT/python/tunedist /tmp/py$1/ && cp /tmp/b$1/_C*.so /tmp/b$1/libtunedist.so /tmp/py$1/tunedist/
}
echo "== compilers: $(command -v g++) $(g++ --version | head -1); system: $(ls /usr/bin/g++* 2>/dev/null)"
conf A -DTUNEDIST_USE_NCCL=ON & pa=$!
conf B -DTUNEDIST_USE_NCCL=ON -DTUNEDIST_CUDA_KERNELS=OFF & pb=$!
conf C -DTUNEDIST_USE_NCCL=OFF & pc=$!
# (As run in session 21 this was a bare `wait`, which also waited for the tee above and hung.)
wait $pa $pb $pc
grep -h "tunedist:" /tmp/confA.log /tmp/confB.log /tmp/confC.log
for v in A B C; do
  echo "== variant $v: load _C alone (no __init__), then nccl_build_info"
  timeout 60 $PY -X faulthandler -c 'import torch, glob, importlib.util; p = glob.glob("/tmp/py'$v'/tunedist/_C*.so")[0]; s = importlib.util.spec_from_file_location("tunedist._C", p); m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print("C loaded", flush=True); print(m.nccl_build_info())' 2>&1 | tail -15
  echo "== variant $v: import tunedist + nccl_build_info"
  PYTHONPATH=/tmp/py$v timeout 60 $PY -X faulthandler -c 'import tunedist; print(tunedist.version(), tunedist._C.nccl_build_info())' 2>&1 | tail -25
  echo "rc=$?"
done
echo "== A with CUDA_VISIBLE_DEVICES empty"
CUDA_VISIBLE_DEVICES= PYTHONPATH=/tmp/pyA timeout 60 $PY -X faulthandler -c 'import tunedist; print(tunedist.version(), tunedist._C.nccl_build_info())' 2>&1 | tail -8
echo "== ldd A"; ldd /tmp/bA/libtunedist.so | head -40
echo "== cuda-gdb backtrace A"
PYTHONPATH=/tmp/pyA timeout 120 cuda-gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args $PY -c 'import tunedist; print(tunedist._C.nccl_build_info())' 2>&1 | grep -v "^\[New Thread\|^\[Thread" | head -120
echo "== /opt/gcc libstdc++:"; ls /opt/gcc/lib64/libstdc++.so* 2>/dev/null; $PY -c 'import torch, os; print(open("/proc/self/maps").read().count("libstdc"))'; grep libstdc /proc/self/maps | head -2
echo DONE
