// Copy-out of a peer's freshly written slot: streaming copyBytes vs cached memcpy, two processes on two cores.
#include <sys/mman.h>
#include <unistd.h>
#include <sched.h>
#include <signal.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cstdint>
#include "kernels/reduce.h"
using namespace tunedist::shm;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int main(){
  const size_t maxb = 16<<20;
  char* shm = (char*)mmap(nullptr, maxb+4096, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  auto* flag = reinterpret_cast<std::atomic<uint64_t>*>(shm);
  auto* ack = reinterpret_cast<std::atomic<uint64_t>*>(shm+64);
  auto* sz = reinterpret_cast<std::atomic<uint64_t>*>(shm+128);
  char* slot = shm+4096;
  flag->store(0); ack->store(0);
  pid_t pid = fork();
  if(pid==0){ pin(1); std::vector<char> src(maxb, 7); uint64_t k=0;
    for(;;){ while(ack->load()!=k) {} size_t n=sz->load(); memcpy(slot, src.data(), n); flag->store(++k); } }
  pin(0);
  std::vector<char> dst(maxb, 1);
  uint64_t k=0;
  for(size_t n: {size_t(16)<<10, size_t(64)<<10, size_t(256)<<10, size_t(1)<<20, size_t(4)<<20, size_t(16)<<20}){
    int it = n <= (1<<20) ? 400 : 40;
    std::vector<double> t[2];
    for(int i=0;i<it;i++) for(int m=0;m<2;m++){
      sz->store(n); ack->store(k); while(flag->load()!=k+1){} ++k;
      auto t0=std::chrono::steady_clock::now();
      if(m==0) copyBytes(dst.data(), slot, n); else copyBytesCached(dst.data(), slot, n);
      t[m].push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count());
    }
    for(auto&v:t) std::sort(v.begin(),v.end());
    printf("%6zuK  stream %9.1f us  cached %9.1f us  stream/cached %.2f\n", n>>10, t[0][it/2], t[1][it/2], t[0][it/2]/t[1][it/2]);
  }
  kill(pid,9); return 0; }
