#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>
#include "kernels/reduce.h"
using namespace tunedist::shm;
template<class F> double med(F f){ std::vector<double> v; for(int i=0;i<20001;i++){auto a=std::chrono::steady_clock::now(); f(); v.push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-a).count());} std::sort(v.begin(),v.end()); return v[v.size()/2]; }
int main(){
  for (size_t bytes : {4096ul, 16384ul, 65536ul}) {
    std::vector<uint8_t> a(bytes, 0x3f), b(bytes, 0x3f), o(bytes);
    const void* s[2] = {a.data(), b.data()};
    ReduceArgs f; f.dtype = DType::kFloat32; ReduceArgs h; h.dtype = DType::kBFloat16; ReduceArgs hf; hf.dtype = DType::kFloat16;
    double tf = med([&]{ reduce(f, o.data(), s, 2, bytes/4); });
    double th = med([&]{ reduce(h, o.data(), s, 2, bytes/2); });
    double tfp = med([&]{ reduce(hf, o.data(), s, 2, bytes/2); });
    double tc = med([&]{ copyBytesCached(o.data(), a.data(), bytes); });
    printf("%6zu B: f32 %.2f  bf16 %.2f  f16 %.2f  copy %.2f us\n", bytes, tf, th, tfp, tc);
  }
}
