#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(){
  int p[2]; pipe(p);
  size_t maxn=16<<20;
  pid_t pid=fork();
  if(pid==0){ close(p[0]); char*src=aligned_alloc(4096,maxn); memset(src,1,maxn); void*a=src; write(p[1],&a,sizeof a); sleep(1000); _exit(0);}
  close(p[1]); void* remote; read(p[0],&remote,sizeof remote);
  char*dst=aligned_alloc(4096,maxn); memset(dst,0,maxn);
  char*loc=aligned_alloc(4096,maxn); memset(loc,2,maxn);
  size_t sizes[]={4096,16384,65536,262144,1<<20,4<<20,16<<20};
  for(int s=0;s<7;s++){ size_t n=sizes[s]; int it = n<(1<<20)?2000:(n<(8<<20)?100:20);
    double tc[2000],tm[2000];
    for(int i=0;i<it;i++){
      struct iovec l={dst,n},r={remote,n};
      double t0=now(); ssize_t got=process_vm_readv(pid,&l,1,&r,1,0); double t1=now();
      if(got!=(ssize_t)n){perror("readv");return 1;}
      memcpy(dst,loc,n); double t2=now();
      tc[i]=t1-t0; tm[i]=t2-t1;}
    qsort(tc,it,sizeof(double),cmp); qsort(tm,it,sizeof(double),cmp);
    printf("%8zu  cma p50 %9.2f us (%5.2f GB/s)  memcpy p50 %9.2f us (%5.2f GB/s)\n",n,tc[it/2],n/tc[it/2]/1e3,tm[it/2],n/tm[it/2]/1e3);
  }
  kill(pid,9); return 0;}
