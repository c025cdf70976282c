// Model, fresh input (memset before each op, timed): 2-rank all_gather out of place.
// slots: copy-in, sync, pull peer slot, own copy.  cma: sync, readv peer input, own copy, sync (readers done).
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include <sched.h>
#include <signal.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstdint>
struct Ctl { std::atomic<uint64_t> step[2]; char pad[48]; void* inAddr[2]; pid_t pid[2]; };
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int main(int argc, char** argv){
  const size_t slotB = 16<<20;
  char* shm = (char*)mmap(nullptr, 4096 + 4*slotB, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  Ctl* ctl = new (shm) Ctl(); ctl->step[0]=0; ctl->step[1]=0;
  auto slot=[&](int r,int b){return shm+4096+(size_t(r)*2+b)*slotB;};
  pid_t child = fork(); int rank = child==0 ? 1 : 0; pin(rank);
  char* in = (char*)aligned_alloc(4096, 16<<20); char* out = (char*)aligned_alloc(4096, 32<<20);
  memset(in, 1, 16<<20); memset(out, 0, 32<<20);
  ctl->inAddr[rank]=in; ctl->pid[rank]=getpid();
  uint64_t step=0;
  auto sync=[&]{ ++step; ctl->step[rank].store(step, std::memory_order_release); while(ctl->step[1-rank].load(std::memory_order_acquire)<step){} };
  sync();
  const int peer=1-rank;
  int fresh = argc > 1 ? atoi(argv[1]) : 1;
  for(size_t total: {size_t(64)<<10, size_t(256)<<10, size_t(1)<<20, size_t(4)<<20, size_t(16)<<20}){
    size_t blk = total/2; int it = total <= (1<<20) ? 1000 : 60;
    std::vector<double> t[2];
    int b = 0;
    for(int i=0;i<it;i++) for(int m=0;m<2;m++){
      sync();
      auto t0=std::chrono::steady_clock::now();
      if (fresh) memset(in, i & 0x7f, blk);
      if (m == 0) {
        b ^= 1;
        memcpy(slot(rank,b), in, blk); sync();
        memcpy(out+peer*blk, slot(peer,b), blk);
        memcpy(out+rank*blk, in, blk);
      } else {
        sync();
        struct iovec l={out+peer*blk, blk}, r={(char*)ctl->inAddr[peer], blk};
        if(process_vm_readv(ctl->pid[peer], &l,1,&r,1,0)!=(ssize_t)blk){perror("readv");return 1;}
        memcpy(out+rank*blk, in, blk);
        sync();
      }
      t[m].push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count());
    }
    for(auto&v:t) std::sort(v.begin(),v.end());
    if(rank==0) printf("%6zuK fresh %d  slots %8.1f  cma %8.1f  ratio %.2f\n", total>>10, fresh, t[0][it/2], t[1][it/2], t[0][it/2]/t[1][it/2]);
  }
  if(child) { kill(child,9); }
  return 0; }
