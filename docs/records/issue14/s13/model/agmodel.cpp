// Model of a 2-rank all_gather of `total` bytes (each rank contributes total/2): (a) through 1 MiB slots, as the
// copying engine does (copy-in cached, copy-out streaming or cached), vs (b) process_vm_readv straight from the peer's
// input. In place (own block already in the output) and out of place. Both processes run the same loop.
#include <sys/mman.h>
#include <sys/uio.h>
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
struct Ctl { std::atomic<uint64_t> step[2]; char pad[48]; void* inAddr[2]; pid_t pid[2]; };
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int main(int argc, char** argv){
  const size_t slotB = 1<<20, maxTotal = 32<<20;
  char* shm = (char*)mmap(nullptr, 4096 + 4*slotB, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  Ctl* ctl = new (shm) Ctl(); ctl->step[0]=0; ctl->step[1]=0;
  auto slot=[&](int r,int b){return shm+4096+(size_t(r)*2+b)*slotB;};
  pid_t child = fork(); int rank = child==0 ? 1 : 0; pin(rank);
  ctl->pid[rank]=getpid();
  std::vector<char> in(maxTotal/2, char(rank+1)), out(maxTotal, 0);
  ctl->inAddr[rank]=in.data();
  uint64_t step=0;
  auto sync=[&]{ ++step; ctl->step[rank].store(step); while(ctl->step[1-rank].load()<step){} };
  sync();
  const int peer=1-rank;
  for(size_t total: {size_t(64)<<10, size_t(256)<<10, size_t(1)<<20, size_t(4)<<20, size_t(16)<<20}){
    size_t blk = total/2; int it = total <= (1<<20) ? 400 : 30;
    std::vector<double> t[4];
    for(int i=0;i<it;i++) for(int m=0;m<4;m++){
      memset(in.data(), i&0xff, 64); // touch
      sync();
      auto t0=std::chrono::steady_clock::now();
      if(m<2){ // slots; m==0 stream out, m==1 cached out
        int b=0;
        for(size_t off=0; off<blk; off+=slotB){ size_t n=std::min(slotB, blk-off);
          copyBytesCached(slot(rank,b), in.data()+off, n); sync();
          if(m==0) copyBytes(out.data()+peer*blk+off, slot(peer,b), n); else copyBytesCached(out.data()+peer*blk+off, slot(peer,b), n);
          b^=1; }
        sync();
      } else { // CMA; m==2 in place (own block there already), m==3 out of place (own copy too)
        struct iovec l={out.data()+peer*blk, blk}, r={(char*)ctl->inAddr[peer], blk};
        if(process_vm_readv(ctl->pid[peer], &l,1,&r,1,0)!=(ssize_t)blk){perror("readv");return 1;}
        if(m==3) memcpy(out.data()+rank*blk, in.data(), blk);
        sync();
      }
      t[m].push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count());
    }
    for(auto&v:t) std::sort(v.begin(),v.end());
    if(rank==0) printf("%6zuK  slots+stream %8.1f  slots+cached %8.1f  cma(in place) %8.1f  cma+own %8.1f us\n", total>>10, t[0][it/2], t[1][it/2], t[2][it/2], t[3][it/2]);
  }
  if(child) { kill(child,9); }
  return 0; }
