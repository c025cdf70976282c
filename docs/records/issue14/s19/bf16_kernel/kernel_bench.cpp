// reduce kernel time, 2 sources, L1/L2-hot, float32 vs bf16 at the same bytes
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include "kernels/reduce.h"
using namespace tunedist::shm;
double t(DType d, size_t count, size_t es) {
  std::vector<char> a(count*es, 0), b(count*es, 0), o(count*es);
  for (size_t i=0;i<count*es;i+=2){a[i+1]=0x3f;b[i+1]=0x3f;}
  const void* s[2] = {a.data(), b.data()};
  ReduceArgs args; args.dtype = d;
  std::vector<double> v;
  for (int r=0;r<2000;++r){ auto t0=std::chrono::steady_clock::now(); reduce(args,o.data(),s,2,count); auto t1=std::chrono::steady_clock::now(); v.push_back(std::chrono::duration<double,std::micro>(t1-t0).count()); }
  std::sort(v.begin(),v.end()); return v[v.size()/2];
}
int main(){ for (size_t bytes : {4096ul, 16384ul, 65536ul, 262144ul}) printf("%7zu B  f32 %.3f us  bf16 %.3f us  fp16 %.3f us\n", bytes, t(DType::kFloat32, bytes/4, 4), t(DType::kBFloat16, bytes/2, 2), t(DType::kFloat16, bytes/2, 2)); }
