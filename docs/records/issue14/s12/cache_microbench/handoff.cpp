// Microbench: one-shot allreduce handoff between two threads, with/without cldemote of the slot lines.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
#include <immintrin.h>
#include <pthread.h>
#ifndef PD
#define PD 16
#endif
struct alignas(64) Ctl { std::atomic<uint64_t> step{0}; char pad[56]; };
Ctl ctl[2];
alignas(64) static char slots[2][2][1 << 20];
static void pin(int c){ cpu_set_t s; CPU_ZERO(&s); CPU_SET(c,&s); pthread_setaffinity_np(pthread_self(), sizeof s, &s);}
static void demote(const char* p, size_t n){ for(size_t i=0;i<n;i+=64) _cldemote((void*)(p+i)); }
int main(int argc, char** argv){
  size_t bytes = atoi(argv[1]); int mode = atoi(argv[2]); int iters = argc>3?atoi(argv[3]):20000;
  size_t n = bytes/4;
  std::vector<double> res(2);
  auto run=[&](int r){
    pin(r);
    std::vector<float> in(n, 1.0f+r), out(n);
    uint64_t step=0; int b=0;
    auto t0=std::chrono::steady_clock::now();
    for(int it=0; it<iters; ++it){
      // buffer reuse: wait until peer passed step-1 (published step after reading b two rounds ago)
      char* my = slots[r][b];
      if(mode==3){ for(size_t i=0;i<bytes;i+=64){ __m512i v=_mm512_loadu_si512((const char*)in.data()+i); _mm512_stream_si512((__m512i*)(my+i), v);} _mm_sfence(); }
      else std::memcpy(my, in.data(), bytes);
      if(mode==1) demote(my, bytes);
      ++step; ctl[r].step.store(step, std::memory_order_release);
      while(ctl[r^1].step.load(std::memory_order_acquire) < step) _mm_pause();
      const float* peer = (const float*)slots[r^1][b];
      if(mode==6||mode==7||mode==8){ const float* srcs[2] = {r==0?in.data():peer, r==0?peer:in.data()};
        alignas(64) float acc[1024];
        if(mode>=7) for(int q=0;q<2;++q) for(size_t j=0;j<std::min<size_t>(1024,n)*4;j+=64) { if(mode==7) _mm_prefetch((const char*)srcs[q]+j,_MM_HINT_T0); else _mm_prefetch((const char*)srcs[q]+j,_MM_HINT_T1);};
        for(size_t base=0;base<n;base+=1024){ size_t m=std::min<size_t>(1024,n-base);
          if(mode>=7 && base+1024<n) for(int q=0;q<2;++q) for(size_t j=0;j<std::min<size_t>(1024,n-base-1024)*4;j+=64) { if(mode==7) _mm_prefetch((const char*)(srcs[q]+base+1024)+j,_MM_HINT_T0); else _mm_prefetch((const char*)(srcs[q]+base+1024)+j,_MM_HINT_T1);};
          for(size_t i=0;i<m;i+=16) _mm512_store_ps(acc+i,_mm512_loadu_ps(srcs[0]+base+i));
          for(size_t i=0;i<m;i+=16) _mm512_store_ps(acc+i,_mm512_add_ps(_mm512_load_ps(acc+i),_mm512_loadu_ps(srcs[1]+base+i)));
          for(size_t i=0;i<m;i+=16) _mm512_storeu_ps(out.data()+base+i,_mm512_load_ps(acc+i));
        } }
      else if(mode==4||mode==5){ const size_t D=PD; for(size_t i=0;i<n;i+=16){ if(mode==4 && (i+D*16)<n) _mm_prefetch((const char*)(peer+i+D*16), _MM_HINT_T0);
          __m512 a=_mm512_loadu_ps(in.data()+i), c=_mm512_loadu_ps(peer+i); _mm512_storeu_ps(out.data()+i, _mm512_add_ps(a,c)); } }
      else for(size_t i=0;i<n;++i) out[i] = r==0 ? in[i]+peer[i] : peer[i]+in[i];
      if(mode==2) demote((const char*)out.data(), bytes);
      b^=1;
      // extra sync so peer finished reading buffer b before we overwrite it next time (simple: wait step)
    }
    auto t1=std::chrono::steady_clock::now();
    res[r]=std::chrono::duration<double,std::micro>(t1-t0).count()/iters;
    if(out[0]!=3.0f) std::printf("wrong\n");
  };
  std::thread a(run,0), c(run,1); a.join(); c.join();
  std::printf("bytes %zu mode %d us/iter %.3f %.3f\n", bytes, mode, res[0], res[1]);
}
