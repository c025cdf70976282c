// Model: 2-rank all_gather (out of place) through slots: alternate 2 buffers (1 sync/op) vs one buffer (+1 sync).
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
struct Ctl { std::atomic<uint64_t> step[2]; };
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int main(int argc, char** argv){
  const size_t slotB = 8<<20;
  char* shm = (char*)mmap(nullptr, 4096 + 4*slotB, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  Ctl* ctl = new (shm) Ctl(); ctl->step[0]=0; ctl->step[1]=0;
  auto slot=[&](int r,int b){return shm+4096+(size_t(r)*2+b)*slotB;};
  pid_t child = fork(); int rank = child==0 ? 1 : 0; pin(rank);
  std::vector<float> in(4<<20, 1.f), out(8<<20, 0.f);
  uint64_t step=0;
  auto sync=[&]{ ++step; ctl->step[rank].store(step, std::memory_order_release); while(ctl->step[1-rank].load(std::memory_order_acquire)<step){} };
  sync();
  const int peer=1-rank;
  bool fresh = argc > 1 && atoi(argv[1]);
  for(size_t total: {size_t(64)<<10, size_t(256)<<10, size_t(1)<<20, size_t(4)<<20}){
    size_t blk = total/2; int it = total <= (1<<20) ? 1000 : 100;
    std::vector<double> t[3];
    int b = 0;
    for(int i=0;i<it;i++) for(int m=0;m<3;m++){
      sync();
      auto t0=std::chrono::steady_clock::now();
      if (fresh) std::fill(in.begin(), in.begin() + blk/4, float(i));
      int use = m==0 ? (b ^= 1) : m==1 ? 0 : -1;
      char* o = (char*)out.data();
      if (use >= 0) {
        memcpy(slot(rank,use), in.data(), blk); sync();
        memcpy(o+peer*blk, slot(peer,use), blk);
        memcpy(o+rank*blk, in.data(), blk);
        if (m==1) sync();  // single buffer: peers done reading before the next op writes
      } else {  // reference: what zero-copy pays (peer reads our input directly)
        // emulate: peer's "input" is its slot 0 written by fill; we copy it
        sync();
        memcpy(o+rank*blk, in.data(), blk);
      }
      t[m].push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count());
    }
    for(auto&v:t) std::sort(v.begin(),v.end());
    if(rank==0) printf("%6zuK fresh %d  alternate %8.1f  single %8.1f  own-copy-only %8.1f us\n", total>>10, fresh, t[0][it/2], t[1][it/2], t[2][it/2]);
  }
  if(child) { kill(child,9); }
  return 0; }
