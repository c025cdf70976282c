#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]); int iters=atoi(argv[2]);
  // shared page to exchange the child's buffer address
  volatile unsigned long* sh=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char* shmbuf=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  memset(shmbuf,1,n);
  sh[0]=0;
  pid_t c=fork();
  if(c==0){ char* b=aligned_alloc(4096,n); memset(b,2,n); sh[1]=(unsigned long)b; __sync_synchronize(); sh[0]=1; while(sh[0]!=2) usleep(1000); _exit(0);}
  while(sh[0]!=1); 
  char* dst=aligned_alloc(4096,n); memset(dst,0,n);
  struct iovec l={dst,n}, r={(void*)sh[1],n};
  for(int w=0;w<10;w++) process_vm_readv(c,&l,1,&r,1,0);
  double t0=now(); for(int i=0;i<iters;i++){ if(process_vm_readv(c,&l,1,&r,1,0)!=(ssize_t)n){perror("cma");return 1;} } double t1=now();
  for(int w=0;w<10;w++) memcpy(dst,shmbuf,n);
  double t2=now(); for(int i=0;i<iters;i++){ memcpy(dst,shmbuf,n); __asm__ volatile(""::"r"(dst):"memory");} double t3=now();
  printf("%zu B: cma %.2f us (%.1f GB/s)  memcpy-from-shm %.2f us (%.1f GB/s)  check %d\n",n,(t1-t0)/iters*1e6,n*iters/(t1-t0)/1e9,(t3-t2)/iters*1e6,n*iters/(t3-t2)/1e9,dst[n-1]);
  sh[0]=2; wait(0); return 0;}
