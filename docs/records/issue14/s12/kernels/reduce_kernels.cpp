#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>
#include "kernels/reduce.h"
using namespace tunedist::shm;
int main(){
  for (size_t bytes : {size_t(256)<<10, size_t(512)<<10, size_t(1)<<20}) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      size_t es = dt==DType::kFloat32?4:2, n = bytes/es;
      std::vector<uint8_t> a(bytes, 0x3f), b(bytes, 0x3f), o(bytes);
      const void* srcs[2] = {a.data(), b.data()};
      ReduceArgs args; args.dtype = dt; args.op = RedOp::kSum;
      std::vector<double> us;
      for (int r=0;r<200;++r){ auto t0=std::chrono::steady_clock::now(); reduce(args, o.data(), srcs, 2, n); us.push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count()); }
      std::sort(us.begin(), us.end());
      std::printf("%7zuK %s %8.2f us  %.2f GB/s(in)\n", bytes>>10, dt==DType::kFloat32?"f32 ":dt==DType::kBFloat16?"bf16":"f16 ", us[100], 2.0*bytes/us[100]/1e3);
    }
  }
}
